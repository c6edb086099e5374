//! The names an SFTP client uses (the container's paths) turned into workspace-relative ones,
//! and the `ls -l` lines of a listing.

use std::path::PathBuf;

use gridlease_protocol::transfer::WORKSPACE;
use gridlease_sandbox::files::FileStat;

/// Why a path is refused: it names something outside `/workspace`.
pub(super) const OUTSIDE: &str = "only /workspace is reachable by sftp (scp and sftp copy into and out of the lease's workspace)";

/// The workspace-relative path that `path` names, `None` when it is outside `/workspace`. A
/// relative path starts at `/workspace` (the session's home); `.` and `..` are resolved
/// lexically first (nothing on the host follows links, so a link in the way fails later
/// instead of being resolved), and `..` above `/` is refused too.
pub(super) fn resolve(path: &str) -> Option<PathBuf> {
    let home = WORKSPACE.trim_start_matches('/');
    let mut parts: Vec<&str> = if path.starts_with('/') {
        Vec::new()
    } else {
        vec![home]
    };
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    if parts.first() != Some(&home) {
        return None;
    }
    Some(parts[1..].iter().collect())
}

/// The absolute path the client sees for the workspace-relative `rel`.
pub(super) fn absolute(rel: &std::path::Path) -> String {
    if rel.as_os_str().is_empty() {
        WORKSPACE.to_string()
    } else {
        format!("{WORKSPACE}/{}", rel.display())
    }
}

/// `drwxr-xr-x`: the type and permission bits of `mode`.
fn mode_string(mode: u32) -> String {
    let kind = match mode & 0o170000 {
        0o040000 => 'd',
        0o120000 => 'l',
        0o010000 => 'p',
        0o140000 => 's',
        0o020000 => 'c',
        0o060000 => 'b',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// The line `ls -l` shows for `name` (as OpenSSH's server writes it: numeric owner, times in
/// UTC, the year instead of the time for files older than six months or in the future).
pub(super) fn longname(name: &str, st: &FileStat, now: i64) -> String {
    const HALF_YEAR: i64 = 182 * 24 * 3600;
    let when = jiff::Timestamp::from_second(st.mtime)
        .map(|t| {
            let recent = st.mtime <= now && now - st.mtime < HALF_YEAR;
            t.strftime(if recent { "%b %e %H:%M" } else { "%b %e  %Y" })
                .to_string()
        })
        .unwrap_or_else(|_| "Jan  1  1970".to_string());
    format!(
        "{} {:>3} {:<8} {:<8} {:>8} {when} {name}",
        mode_string(st.mode),
        st.nlink,
        st.uid,
        st.gid,
        st.size
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_in_the_workspace() {
        for (p, rel) in [
            (".", ""),
            ("", ""),
            ("a/b", "a/b"),
            ("/workspace", ""),
            ("/workspace/", ""),
            ("/workspace/a/./b/../c", "a/c"),
            ("/workspace/../workspace/x", "x"),
            ("//workspace//x", "x"),
        ] {
            assert_eq!(resolve(p), Some(PathBuf::from(rel)), "{p}");
        }
        for p in [
            "/",
            "/etc/passwd",
            "/workspace/../etc",
            "..",
            "../workspace2",
            "/workspacex",
            "/..",
            "a/../../..",
        ] {
            assert_eq!(resolve(p), None, "{p}");
        }
    }

    #[test]
    fn listing_lines_look_like_ls() {
        let st = FileStat {
            mode: 0o100644,
            size: 1234,
            uid: 65534,
            gid: 65534,
            nlink: 1,
            atime: 0,
            mtime: 1_700_000_000,
        };
        assert_eq!(
            longname("f", &st, 1_700_000_100),
            "-rw-r--r--   1 65534    65534        1234 Nov 14 22:13 f"
        );
        let dir = FileStat {
            mode: 0o040755,
            ..st
        };
        assert!(longname("d", &dir, 1_800_000_000).starts_with("drwxr-xr-x"));
        assert!(longname("d", &dir, 1_800_000_000).contains("Nov 14  2023 d"));
    }
}
