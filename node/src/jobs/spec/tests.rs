//! The job spec against good and bad files: every refusal names its field and line.

use super::*;

const GOOD: &str = r#"# a sweep
name: sweep-1
resources:
  gpu: "4090"
  gpus: 1
  vram: 24GiB
  max_price: 0.50
  min_reputation: 0.4
image: busybox:1
envs:
  LR: "0.1"
inputs:
  /workspace/data: data
setup: echo setup
run: |
  echo task $TASK_INDEX of $TASK_COUNT
tasks: 12
outputs:
  - /workspace/out
checkpoint:
  path: /workspace/ckpt
  every: 30s
retries:
  max: 2
  on_exit_codes: [3]
concurrency: 3
timeout: 10m
budget:
  max_total: "2.5"
"#;

fn dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("data")).unwrap();
    d
}

fn refused(text: &str) -> SpecError {
    let d = dir();
    load(text, d.path()).expect_err("the spec should be refused")
}

#[test]
fn a_full_spec_loads_with_paths_resolved_and_its_query_built() {
    let d = dir();
    let job = load(GOOD, d.path()).unwrap();
    assert_eq!(job.task_count(), 12);
    assert_eq!(job.spec.timeout, Duration(600));
    assert_eq!(job.spec.checkpoint.as_ref().unwrap().every, Duration(30));
    assert_eq!(job.checkpoint.as_deref(), Some("ckpt"));
    assert_eq!(job.outputs, vec!["out".to_string()]);
    assert_eq!(
        job.inputs,
        vec![(d.path().join("data"), "data".to_string())]
    );
    assert_eq!(job.spec.retries.on_exit_codes, vec![3]);
    assert_eq!(
        job.spec.budget.as_ref().unwrap().max_total.0,
        "2.5".parse().unwrap()
    );
    assert_eq!(
        job.query(),
        "free>=1 gpu~4090 vram>=24 price<=0.50 rep>=0.4 sort:price"
    );
    gridlease_contracts::query::Query::parse(&job.query()).unwrap();
    // The checked job travels as JSON (the store) and comes back the same.
    let back: Job = serde_json::from_str(&serde_json::to_string(&job).unwrap()).unwrap();
    assert_eq!(back, job);
}

#[test]
fn an_unknown_field_is_refused_with_its_name_and_line() {
    let e = refused(&GOOD.replace("concurrency: 3", "concurrency: 3\nconcurency: 4"));
    assert_eq!(e.line, Some(27), "{e}");
    assert!(e.message.contains("concurency"), "{e}");
    let e = refused(&GOOD.replace("  gpus: 1", "  gpus: 1\n  gpu_count: 2"));
    assert_eq!(e.field, "resources.gpu_count");
    assert_eq!(e.line, Some(6), "{e}");
    assert!(
        e.to_string()
            .starts_with("line 6: resources.gpu_count: unknown field `gpu_count`"),
        "{e}"
    );
}

#[test]
fn a_negative_or_zero_task_count_is_refused() {
    for bad in ["-1", "0", "1.5", "100001"] {
        let e = refused(&GOOD.replace("tasks: 12", &format!("tasks: {bad}")));
        assert_eq!(e.field, "tasks", "{bad}: {e}");
        assert_eq!(e.line, Some(17), "{bad}: {e}");
        assert!(e.message.contains("not a number of tasks"), "{bad}: {e}");
    }
}

#[test]
fn a_missing_input_path_or_tasks_file_is_refused_before_anything_runs() {
    let e = refused(&GOOD.replace("/workspace/data: data", "/workspace/data: nowhere"));
    assert_eq!(e.field, "inputs./workspace/data");
    assert_eq!(e.line, Some(13), "{e}");
    assert!(e.message.contains("nowhere"), "{e}");
    let e = refused(&GOOD.replace("tasks: 12", "tasks: prompts.txt"));
    assert_eq!(e.field, "tasks");
    assert!(e.message.contains("prompts.txt"), "{e}");
}

#[test]
fn a_tasks_file_gives_one_task_per_line() {
    let d = dir();
    std::fs::write(d.path().join("p.txt"), "a cat\na dog\n\nan owl\n").unwrap();
    let job = load(&GOOD.replace("tasks: 12", "tasks: p.txt"), d.path()).unwrap();
    assert_eq!(job.task_args, vec!["a cat", "a dog", "", "an owl"]);
}

#[test]
fn values_out_of_range_are_refused_with_their_field() {
    let cases = [
        ("concurrency: 3", "concurrency: 0", "concurrency", 26),
        ("timeout: 10m", "timeout: 2s", "timeout", 27),
        ("timeout: 10m", "timeout: soon", "timeout", 27),
        ("  every: 30s", "  every: 1s", "checkpoint.every", 22),
        (
            "  path: /workspace/ckpt",
            "  path: /etc",
            "checkpoint.path",
            21,
        ),
        ("  - /workspace/out", "  - ../out", "outputs[0]", 19),
        (
            "  on_exit_codes: [3]",
            "  on_exit_codes: [0]",
            "retries.on_exit_codes",
            25,
        ),
        (
            "  max_price: 0.50",
            "  max_price: -1",
            "resources.max_price",
            7,
        ),
        (
            "  min_reputation: 0.4",
            "  min_reputation: 2",
            "resources.min_reputation",
            8,
        ),
        ("  vram: 24GiB", "  vram: lots", "resources.vram", 6),
        (
            "  LR: \"0.1\"",
            "  TASK_INDEX: \"1\"",
            "envs.TASK_INDEX",
            11,
        ),
        ("name: sweep-1", "name: a b", "name", 2),
        (
            "  max_total: \"2.5\"",
            "  max_total: 0",
            "budget.max_total",
            29,
        ),
    ];
    for (from, to, field, line) in cases {
        assert!(GOOD.contains(from), "{from}");
        let e = refused(&GOOD.replace(from, to));
        assert_eq!(e.field, field, "{to}: {e}");
        assert_eq!(e.line, Some(line), "{to}: {e}");
    }
}

#[test]
fn several_tasks_per_lease_need_outputs_and_checkpoint_apart_from_the_inputs() {
    let d = dir();
    let shared = GOOD.replace("concurrency: 3", "concurrency: 3\ntasks_per_lease: 4");
    let job = load(&shared, d.path()).unwrap();
    assert!(job.shares_leases());
    assert_eq!(job.spec.tasks_per_lease, 4);
    assert!(!load(GOOD, d.path()).unwrap().shares_leases());
    let cases = [
        (
            "tasks_per_lease: 4",
            "tasks_per_lease: 0",
            "tasks_per_lease",
            27,
            "1 to 1000",
        ),
        (
            "  - /workspace/out",
            "  - /workspace/data/out",
            "outputs[0]",
            19,
            "overlaps the input /workspace/data",
        ),
        (
            "  path: /workspace/ckpt",
            "  path: /workspace",
            "checkpoint.path",
            21,
            "not /workspace itself",
        ),
        (
            "  path: /workspace/ckpt",
            "  path: .gridlease/ckpt",
            "checkpoint.path",
            21,
            "/workspace/.gridlease is the runner's",
        ),
    ];
    for (from, to, field, line, says) in cases {
        assert!(shared.contains(from), "{from}");
        let e = refused(&shared.replace(from, to));
        assert_eq!(e.field, field, "{to}: {e}");
        assert_eq!(e.line, Some(line), "{to}: {e}");
        assert!(e.message.contains(says), "{to}: {e}");
    }
    // With a lease per task the same paths are fine: nothing is removed between tasks.
    load(
        &GOOD.replace("  - /workspace/out", "  - /workspace/data/out"),
        d.path(),
    )
    .unwrap();
}

#[test]
fn a_missing_required_field_and_garbage_are_refused() {
    let e = refused(&GOOD.replace("run: |\n  echo task $TASK_INDEX of $TASK_COUNT\n", ""));
    assert!(e.message.contains("missing field `run`"), "{e}");
    let e = refused("name: [unclosed");
    assert!(e.line.is_some(), "{e}");
    let e = refused("- just\n- a list\n");
    assert!(e.message.contains("invalid type"), "{e}");
    let big = "#".repeat(MAX_SPEC_BYTES + 1);
    assert!(refused(&big).message.contains("larger than"));
}

#[test]
fn the_committed_json_schema_is_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/job-spec.schema.json");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let mut generated = serde_json::to_string_pretty(&json_schema()).unwrap();
    generated.push('\n');
    assert!(
        committed == generated,
        "docs/job-spec.schema.json is stale: cargo run -p gridlease-node --example job_schema > docs/job-spec.schema.json"
    );
}

#[test]
fn the_schema_refuses_unknown_fields_and_requires_the_essentials() {
    let s = json_schema();
    assert_eq!(s["additionalProperties"], false);
    let required: Vec<&str> = s["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for f in ["name", "image", "run", "tasks", "timeout"] {
        assert!(required.contains(&f), "{f} not required: {required:?}");
    }
}

#[test]
fn an_offer_unfit_for_the_job_says_why() {
    let d = dir();
    let fit = OfferTerms {
        min_duration_s: 60,
        max_duration_s: 86_400,
        upload_hold_s: 300,
        output_retention_s: 600,
        verify_window_s: 30,
    };
    let job = load(GOOD, d.path()).unwrap();
    assert_eq!(job.unfit(&fit), None);
    let why = |job: &Job, t: OfferTerms| job.unfit(&t).unwrap_or_default();
    assert!(
        why(
            &job,
            OfferTerms {
                max_duration_s: 300,
                ..fit
            }
        )
        .starts_with("take no lease as long as the timeout (600 s; longest 300 s)")
    );
    assert!(
        why(
            &job,
            OfferTerms {
                upload_hold_s: 0,
                ..fit
            }
        )
        .contains("uploads")
    );
    assert!(
        why(
            &job,
            OfferTerms {
                output_retention_s: 0,
                ..fit
            }
        )
        .contains("keep no outputs")
    );
    // A timeout below the offer's shortest lease rules it out for a lease per task only.
    let short = load(&GOOD.replace("timeout: 10m", "timeout: 20s"), d.path()).unwrap();
    assert!(
        why(&short, fit).starts_with("take no lease as short as the timeout (20 s; shortest 60 s"),
        "{}",
        why(&short, fit)
    );
    let shared = load(
        &GOOD.replace("timeout: 10m", "timeout: 20s\ntasks_per_lease: 4"),
        d.path(),
    )
    .unwrap();
    assert_eq!(shared.unfit(&fit), None);
    // A shared lease copies its outputs while it runs: it needs no retention.
    assert_eq!(
        shared.unfit(&OfferTerms {
            output_retention_s: 0,
            ..fit
        }),
        None
    );
    let verified = load(
        &GOOD.replace("  gpus: 1", "  gpus: 1\n  verified: true"),
        d.path(),
    )
    .unwrap();
    assert!(
        why(
            &verified,
            OfferTerms {
                verify_window_s: 0,
                ..fit
            }
        )
        .contains("GPU check")
    );
}

#[test]
fn the_offer_wait_defaults_to_five_minutes_and_is_bounded() {
    let d = dir();
    assert_eq!(load(GOOD, d.path()).unwrap().spec.offer_wait.0, 300);
    let with = GOOD.replace("concurrency: 3", "concurrency: 3\noffer_wait: 90s");
    assert_eq!(load(&with, d.path()).unwrap().spec.offer_wait.0, 90);
    for bad in ["offer_wait: 0", "offer_wait: 8d"] {
        let e = refused(&GOOD.replace("concurrency: 3", &format!("concurrency: 3\n{bad}")));
        assert_eq!(e.field, "offer_wait", "{bad}: {e}");
        assert!(e.to_string().contains("1 s to 7 days"), "{bad}: {e}");
    }
}
