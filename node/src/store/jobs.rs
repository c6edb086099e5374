//! Jobs in the store (issue 46): each job with its checked spec, its tasks, every attempt of
//! each task (one lease), and the providers excluded for the job. The job runner
//! (`crate::jobs`) is the one writer; a restarted node resumes from these rows.

use rusqlite::{OptionalExtension, Row, params};

use super::sql::{i64_of, u64_of};
use super::{Store, StoreError};

/// A job row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredJob {
    /// Its id (16 hex digits).
    pub id: String,
    /// The spec's name.
    pub name: String,
    /// The checked job (`crate::jobs::spec::Job`), JSON.
    pub spec: String,
    /// Where outputs land (`OUT/<task>/`).
    pub out_dir: String,
    /// `running`, `completed`, `failed`, `cancelled` or `budget_reached`.
    pub state: String,
    /// Unix ms.
    pub created_at: u64,
    /// Unix ms, once over.
    pub ended_at: Option<u64>,
    /// Why it ended, in words.
    pub message: Option<String>,
}

/// A task row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTask {
    /// Its index in the job, from 0.
    pub task: u32,
    /// `pending`, `running`, `succeeded`, `failed`, `cancelled` or `not_started`.
    pub state: String,
    /// Attempts started.
    pub attempts: u32,
    /// The last attempt's exit code, if its command exited.
    pub exit_code: Option<i32>,
    /// Why it failed or was not started, in words.
    pub message: Option<String>,
}

/// An attempt row: one lease of one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAttempt {
    /// The task.
    pub task: u32,
    /// 1-based.
    pub attempt: u32,
    /// The provider's peer id.
    pub provider: String,
    /// The offer rented.
    pub offer: String,
    /// Price per GPU-hour, micro-units.
    pub price: u64,
    /// The lease's budget cap, micro-units.
    pub cap: u64,
    /// The lease, once rented.
    pub lease_id: Option<String>,
    /// `renting`, `starting` (held for uploads), `running` or `ended`.
    pub phase: String,
    /// Unix ms.
    pub started_at: u64,
    /// Unix ms.
    pub ended_at: Option<u64>,
    /// `succeeded`, `exited`, `provider_fault`, `renter_side` or `cancelled`.
    pub verdict: Option<String>,
    /// Why it ended, in words (the close reason and what the provider said).
    pub reason: Option<String>,
    /// The command's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// What the lease cost once settled, micro-units. A lease that runs several tasks has its
    /// cost (and its cap) on its first attempt; the others' caps are 0.
    pub spent: Option<u64>,
    /// Where this attempt's output starts in its lease's log (0 but for a lease's later tasks).
    pub log_from: u64,
    /// Unix ms when its task was handed to a lease that runs several tasks.
    pub run_at: Option<u64>,
}

fn job_of(r: &Row<'_>) -> rusqlite::Result<StoredJob> {
    Ok(StoredJob {
        id: r.get(0)?,
        name: r.get(1)?,
        spec: r.get(2)?,
        out_dir: r.get(3)?,
        state: r.get(4)?,
        created_at: u64_of(r.get(5)?),
        ended_at: r.get::<_, Option<i64>>(6)?.map(u64_of),
        message: r.get(7)?,
    })
}

fn task_of(r: &Row<'_>) -> rusqlite::Result<StoredTask> {
    Ok(StoredTask {
        task: r.get(0)?,
        state: r.get(1)?,
        attempts: r.get(2)?,
        exit_code: r.get(3)?,
        message: r.get(4)?,
    })
}

fn attempt_of(r: &Row<'_>) -> rusqlite::Result<StoredAttempt> {
    Ok(StoredAttempt {
        task: r.get(0)?,
        attempt: r.get(1)?,
        provider: r.get(2)?,
        offer: r.get(3)?,
        price: u64_of(r.get(4)?),
        cap: u64_of(r.get(5)?),
        lease_id: r.get(6)?,
        phase: r.get(7)?,
        started_at: u64_of(r.get(8)?),
        ended_at: r.get::<_, Option<i64>>(9)?.map(u64_of),
        verdict: r.get(10)?,
        reason: r.get(11)?,
        exit_code: r.get(12)?,
        spent: r.get::<_, Option<i64>>(13)?.map(u64_of),
        log_from: u64_of(r.get(14)?),
        run_at: r.get::<_, Option<i64>>(15)?.map(u64_of),
    })
}

const JOB_COLS: &str = "job_id, name, spec, out_dir, state, created_at, ended_at, message";
const ATTEMPT_COLS: &str = "task, attempt, provider, offer, price, cap, lease_id, phase, \
     started_at, ended_at, verdict, reason, exit_code, spent, log_from, run_at";

impl Store {
    /// Stores a new job and its `tasks` pending tasks, in one transaction.
    pub fn insert_job(&mut self, job: &StoredJob, tasks: u32) -> Result<(), StoreError> {
        let path = self.path.clone();
        let e = |source| super::sql::classify(&path, source);
        let tx = self.conn.transaction().map_err(e)?;
        tx.execute(
            &format!("INSERT INTO jobs({JOB_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
            params![
                job.id,
                job.name,
                job.spec,
                job.out_dir,
                job.state,
                i64_of(job.created_at),
                job.ended_at.map(i64_of),
                job.message
            ],
        )
        .map_err(e)?;
        {
            let mut st = tx
                .prepare(
                    "INSERT INTO job_tasks(job_id, task, state, attempts) VALUES (?1, ?2, 'pending', 0)",
                )
                .map_err(e)?;
            for t in 0..tasks {
                st.execute(params![job.id, t]).map_err(e)?;
            }
        }
        tx.commit().map_err(e)
    }

    /// Every job, newest first.
    pub fn jobs(&self) -> Result<Vec<StoredJob>, StoreError> {
        let mut st = self
            .conn
            .prepare(&format!(
                "SELECT {JOB_COLS} FROM jobs ORDER BY created_at DESC, job_id"
            ))
            .map_err(self.err())?;
        st.query_map([], job_of)
            .map_err(self.err())?
            .collect::<Result<_, _>>()
            .map_err(self.err())
    }

    /// One job.
    pub fn job(&self, id: &str) -> Result<Option<StoredJob>, StoreError> {
        self.conn
            .query_row(
                &format!("SELECT {JOB_COLS} FROM jobs WHERE job_id = ?1"),
                [id],
                job_of,
            )
            .optional()
            .map_err(self.err())
    }

    /// Ends (or changes the state of) a job.
    pub fn set_job_state(
        &mut self,
        id: &str,
        state: &str,
        ended_at: Option<u64>,
        message: Option<&str>,
    ) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE jobs SET state = ?2, ended_at = ?3, message = ?4 WHERE job_id = ?1",
                params![id, state, ended_at.map(i64_of), message],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// A job's tasks, in order.
    pub fn job_tasks(&self, id: &str) -> Result<Vec<StoredTask>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT task, state, attempts, exit_code, message FROM job_tasks
                 WHERE job_id = ?1 ORDER BY task",
            )
            .map_err(self.err())?;
        st.query_map([id], task_of)
            .map_err(self.err())?
            .collect::<Result<_, _>>()
            .map_err(self.err())
    }

    /// Writes a task's row.
    pub fn put_task(&mut self, id: &str, t: &StoredTask) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE job_tasks SET state = ?3, attempts = ?4, exit_code = ?5, message = ?6
                 WHERE job_id = ?1 AND task = ?2",
                params![id, t.task, t.state, t.attempts, t.exit_code, t.message],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// A job's attempts, by task then attempt.
    pub fn job_attempts(&self, id: &str) -> Result<Vec<StoredAttempt>, StoreError> {
        let mut st = self
            .conn
            .prepare(&format!(
                "SELECT {ATTEMPT_COLS} FROM job_attempts WHERE job_id = ?1 ORDER BY task, attempt"
            ))
            .map_err(self.err())?;
        st.query_map([id], attempt_of)
            .map_err(self.err())?
            .collect::<Result<_, _>>()
            .map_err(self.err())
    }

    /// Writes an attempt's row (inserted the first time), with its task's row when given, in
    /// one transaction: a task is `running` exactly while one of its attempts is not `ended`.
    pub fn put_attempt(
        &mut self,
        id: &str,
        a: &StoredAttempt,
        task: Option<&StoredTask>,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let e = |source| super::sql::classify(&path, source);
        let tx = self.conn.transaction().map_err(e)?;
        tx.execute(
            &format!(
                "INSERT INTO job_attempts(job_id, {ATTEMPT_COLS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                         ?17)
                 ON CONFLICT(job_id, task, attempt) DO UPDATE SET
                    lease_id = excluded.lease_id, phase = excluded.phase,
                    ended_at = excluded.ended_at, verdict = excluded.verdict,
                    reason = excluded.reason, exit_code = excluded.exit_code,
                    spent = excluded.spent, log_from = excluded.log_from,
                    run_at = excluded.run_at"
            ),
            params![
                id,
                a.task,
                a.attempt,
                a.provider,
                a.offer,
                i64_of(a.price),
                i64_of(a.cap),
                a.lease_id,
                a.phase,
                i64_of(a.started_at),
                a.ended_at.map(i64_of),
                a.verdict,
                a.reason,
                a.exit_code,
                a.spent.map(i64_of),
                i64_of(a.log_from),
                a.run_at.map(i64_of)
            ],
        )
        .map_err(e)?;
        if let Some(task) = task {
            tx.execute(
                "UPDATE job_tasks SET state = ?3, attempts = ?4, exit_code = ?5, message = ?6
                 WHERE job_id = ?1 AND task = ?2",
                params![
                    id,
                    task.task,
                    task.state,
                    task.attempts,
                    task.exit_code,
                    task.message
                ],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)
    }

    /// Excludes `provider` from the rest of job `id`.
    pub fn exclude_provider(
        &mut self,
        id: &str,
        provider: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT OR IGNORE INTO job_excluded(job_id, provider, reason) VALUES (?1, ?2, ?3)",
                params![id, provider, reason],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// The providers excluded from job `id`, with why.
    pub fn excluded_providers(&self, id: &str) -> Result<Vec<(String, String)>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT provider, reason FROM job_excluded WHERE job_id = ?1 ORDER BY provider",
            )
            .map_err(self.err())?;
        st.query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(self.err())?
            .collect::<Result<_, _>>()
            .map_err(self.err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str) -> StoredJob {
        StoredJob {
            id: id.into(),
            name: "sweep".into(),
            spec: "{}".into(),
            out_dir: "/tmp/out".into(),
            state: "running".into(),
            created_at: 1,
            ended_at: None,
            message: None,
        }
    }

    #[test]
    fn a_job_its_tasks_and_attempts_read_back_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.db");
        {
            let mut s = Store::open(&path).unwrap();
            s.insert_job(&job("a1"), 3).unwrap();
            let mut t = s.job_tasks("a1").unwrap();
            assert_eq!(t.len(), 3);
            assert!(t.iter().all(|t| t.state == "pending" && t.attempts == 0));
            t[1].state = "running".into();
            t[1].attempts = 1;
            let a = StoredAttempt {
                task: 1,
                attempt: 1,
                provider: "12D3p".into(),
                offer: "ab".into(),
                price: 400_000,
                cap: 1_000,
                lease_id: None,
                phase: "renting".into(),
                started_at: 5,
                ended_at: None,
                verdict: None,
                reason: None,
                exit_code: None,
                spent: None,
                log_from: 0,
                run_at: None,
            };
            s.put_attempt("a1", &a, Some(&t[1])).unwrap();
            let ended = StoredAttempt {
                lease_id: Some("ff".into()),
                phase: "ended".into(),
                log_from: 4096,
                run_at: Some(7),
                verdict: Some("provider_fault".into()),
                spent: Some(700),
                ended_at: Some(9),
                ..a.clone()
            };
            t[1].state = "pending".into();
            s.put_attempt("a1", &ended, Some(&t[1])).unwrap();
            s.exclude_provider("a1", "12D3p", "provider_unreachable")
                .unwrap();
            s.exclude_provider("a1", "12D3p", "again").unwrap();
            s.set_job_state("a1", "completed", Some(10), Some("done"))
                .unwrap();
        }
        let s = Store::open(&path).unwrap();
        let j = s.job("a1").unwrap().unwrap();
        assert_eq!((j.state.as_str(), j.ended_at), ("completed", Some(10)));
        let a = s.job_attempts("a1").unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].phase, "ended");
        assert_eq!(a[0].spent, Some(700));
        assert_eq!(a[0].lease_id.as_deref(), Some("ff"));
        assert_eq!(s.job_tasks("a1").unwrap()[1].attempts, 1);
        assert_eq!(
            s.excluded_providers("a1").unwrap(),
            vec![("12D3p".to_string(), "provider_unreachable".to_string())]
        );
        assert_eq!(s.jobs().unwrap().len(), 1);
        assert!(s.job("zz").unwrap().is_none());
    }

    #[test]
    fn a_state_outside_the_list_is_refused_by_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("node.db")).unwrap();
        let mut j = job("b2");
        j.state = "sleeping".into();
        assert!(s.insert_job(&j, 1).is_err());
        assert!(s.job("b2").unwrap().is_none(), "nothing half-written");
    }
}
