//! The job routes (issue 46): submit a spec, list and show jobs, cancel one, read a task's
//! output (`crate::jobs`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::ApiState;
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem, ProblemType as P};
use crate::jobs::{JobError, JobSubmit, JobView};

fn job_err(e: JobError) -> ApiError {
    match e {
        JobError::Spec(_) | JobError::Out(_) => ApiError::new(P::InvalidJobSpec, e.to_string())
            .hint("fix the spec (docs/jobs.md lists every field); nothing was rented"),
        JobError::Unknown(_) => ApiError::new(P::UnknownJob, e.to_string())
            .hint("`gridlease job list` shows this node's jobs"),
        JobError::Ambiguous(_) => ApiError::new(P::AmbiguousId, e.to_string()),
        JobError::Over(_) => ApiError::new(P::JobOver, e.to_string()),
        JobError::Store(e) => ApiError::internal(e),
    }
}

/// `POST /v1/jobs`.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    operation_id = "submitJob",
    tag = "jobs",
    summary = "Check a job spec and start running it",
    description = "The spec is checked whole (its fields, its tasks file, its input paths) before anything is rented; a spec that cannot run answers 422 `invalid-job-spec` naming the field and line. Then the job runs in this node until it is over, also across restarts (follow it with getJob).",
    request_body = JobSubmit,
    responses(
        (status = 201, description = "The job was stored and runs", body = JobView,
            links(("getJob" = (operation_id = "getJob", parameters(("id" = "$response.body#/job_id")),
                description = "The new job")))),
        (status = 400, description = "The body is not JSON (`malformed-body`)", content_type = "application/problem+json", body = Problem),
        (status = 415, description = "The body is not application/json (`unsupported-media-type`)", content_type = "application/problem+json", body = Problem),
        (status = 422, description = "The body is not a valid request (`invalid-body`), or the spec cannot run (`invalid-job-spec`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn submit(
    State(s): State<ApiState>,
    ApiJson(req): ApiJson<JobSubmit>,
) -> Result<Response, ApiError> {
    let view = s.jobs.submit(req).await.map_err(job_err)?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// `GET /v1/jobs`.
#[utoipa::path(
    get,
    path = "/v1/jobs",
    operation_id = "listJobs",
    tag = "jobs",
    summary = "This node's jobs, newest first (without their tasks)",
    responses(
        (status = 200, description = "Every job", body = Vec<JobView>),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn list(State(s): State<ApiState>) -> Result<Json<Vec<JobView>>, ApiError> {
    Ok(Json(s.jobs.list().await.map_err(job_err)?))
}

/// `GET /v1/jobs/{id}`.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    operation_id = "getJob",
    tag = "jobs",
    summary = "One job with every task and attempt",
    params(("id" = String, Path, description = "Job id or unique hex prefix")),
    responses(
        (status = 200, description = "The job", body = JobView),
        (status = 404, description = "No such job (`unknown-job`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several jobs (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn get(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<JobView>, ApiError> {
    Ok(Json(s.jobs.get(&id).await.map_err(job_err)?))
}

/// `POST /v1/jobs/{id}/cancel`.
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/cancel",
    operation_id = "cancelJob",
    tag = "jobs",
    summary = "Cancel a running job: every lease of it is stopped and settles",
    description = "Answers once the cancel was taken in hand; the job is `cancelled` once its leases settled (poll getJob). A body, if any, is ignored.",
    params(("id" = String, Path, description = "Job id or unique hex prefix")),
    responses(
        (status = 200, description = "The cancel was taken in hand", body = JobView),
        (status = 404, description = "No such job (`unknown-job`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The job is over already (`job-over`), or the prefix matches several jobs (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn cancel(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<JobView>, ApiError> {
    Ok(Json(s.jobs.cancel(&id).await.map_err(job_err)?))
}

/// Query string of `GET /v1/jobs/{id}/tasks/{task}/logs`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct TaskLogsParams {
    /// Byte offset to read from.
    #[serde(default)]
    #[param(default = 0)]
    pub(super) from: u64,
    /// The attempt (1-based); default: the task's last.
    #[param(minimum = 1)]
    pub(super) attempt: Option<u32>,
}

/// `GET /v1/jobs/{id}/tasks/{task}/logs`.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/tasks/{task}/logs",
    operation_id = "getJobTaskLogs",
    tag = "jobs",
    summary = "A task's output, as this node kept it, from an offset",
    params(
        ("id" = String, Path, description = "Job id or unique hex prefix"),
        ("task" = u32, Path, description = "Task index, from 0"),
        TaskLogsParams,
    ),
    responses(
        (status = 200, description = "Raw output bytes, at most 1 MiB per call", content_type = "application/octet-stream", body = Vec<u8>,
            headers(
                ("x-gridlease-next-offset" = u64, description = "The offset to ask for next"),
                ("x-gridlease-eof" = String, description = "Present (`1`) once no more output will come for this attempt"),
            )),
        (status = 400, description = "A parameter is malformed (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such job (`unknown-job`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several jobs (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn task_logs(
    State(s): State<ApiState>,
    ApiPath((id, task)): ApiPath<(String, u32)>,
    ApiQuery(p): ApiQuery<TaskLogsParams>,
) -> Result<Response, ApiError> {
    let (data, next, more) = s
        .jobs
        .logs(&id, task, p.attempt, p.from)
        .await
        .map_err(job_err)?;
    let eof = !more && data.is_empty();
    let mut resp = (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        data,
    )
        .into_response();
    let h = resp.headers_mut();
    if let Ok(v) = next.to_string().parse() {
        h.insert(super::NEXT_OFFSET_HEADER, v);
    }
    if eof && let Ok(v) = "1".parse() {
        h.insert(super::EOF_HEADER, v);
    }
    Ok(resp)
}
