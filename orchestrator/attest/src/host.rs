//! What the supervisor observed on the host, beside the engine's inspect
//! document: the host's accounts (`/etc/passwd`, `/etc/group`,
//! `/etc/subuid`, `/etc/subgid`) and the mount the worktree sits on
//! (`/proc/self/mountinfo`). The adapter reads the files; this module only
//! parses their text (`crate::tests::the_crate_reads_data_and_does_no_io`).
//!
//! Invariants:
//! - Parsing never fails: a line that cannot be read is skipped, because a
//!   property built on these lists fails closed where it matters (an
//!   unreadable mount table yields no mount, which fails its property)
//!   (`tests::accounts_and_ranges_parse_and_clash`,
//!   `tests::the_topmost_mount_of_a_path_is_found`).
//! - Mount points are compared after undoing the kernel's octal escapes
//!   (`\040` for a space), so a path with spaces is still found.

use serde::Serialize;

/// One host account or group: its name and numeric id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Account {
    pub name: String,
    pub id: u32,
}

/// A range of subordinate ids delegated to a host account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubRange {
    pub owner: String,
    pub start: u32,
    pub count: u32,
}

impl SubRange {
    fn contains(&self, id: u32) -> bool {
        id >= self.start && u64::from(id) < u64::from(self.start) + u64::from(self.count)
    }
}

/// The host's accounts, groups and subordinate id ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAccounts {
    pub users: Vec<Account>,
    pub groups: Vec<Account>,
    pub sub_uids: Vec<SubRange>,
    pub sub_gids: Vec<SubRange>,
}

/// Why a sandbox id is refused: the host account it would be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdClash {
    User(Account),
    Group(Account),
    SubUid(SubRange),
    SubGid(SubRange),
}

impl std::fmt::Display for IdClash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdClash::User(a) => write!(
                f,
                "uid {} is the host user {:?} (/etc/passwd)",
                a.id, a.name
            ),
            IdClash::Group(a) => {
                write!(
                    f,
                    "gid {} is the host group {:?} (/etc/group)",
                    a.id, a.name
                )
            }
            IdClash::SubUid(r) => write!(
                f,
                "the uid falls in {}..{} delegated to {:?} (/etc/subuid)",
                r.start,
                u64::from(r.start) + u64::from(r.count),
                r.owner
            ),
            IdClash::SubGid(r) => write!(
                f,
                "the gid falls in {}..{} delegated to {:?} (/etc/subgid)",
                r.start,
                u64::from(r.start) + u64::from(r.count),
                r.owner
            ),
        }
    }
}

/// `name:x:id:...` lines (passwd and group share the first three fields).
fn accounts(text: &str) -> Vec<Account> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut fields = l.split(':');
            let name = fields.next()?.trim();
            let id = fields.nth(1)?.trim().parse().ok()?;
            (!name.is_empty()).then(|| Account {
                name: name.to_owned(),
                id,
            })
        })
        .collect()
}

/// `owner:start:count` lines.
fn ranges(text: &str) -> Vec<SubRange> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut fields = l.split(':');
            Some(SubRange {
                owner: fields.next()?.trim().to_owned(),
                start: fields.next()?.trim().parse().ok()?,
                count: fields.next()?.trim().parse().ok()?,
            })
        })
        .collect()
}

impl HostAccounts {
    /// Reads the text of `/etc/passwd`, `/etc/group`, `/etc/subuid` and
    /// `/etc/subgid` (an absent file is the empty text).
    pub fn parse(passwd: &str, group: &str, subuid: &str, subgid: &str) -> Self {
        Self {
            users: accounts(passwd),
            groups: accounts(group),
            sub_uids: ranges(subuid),
            sub_gids: ranges(subgid),
        }
    }

    /// Every host account that `uid:gid` would be, first the user, then the
    /// group, then the delegated ranges. Empty when the ids are nobody's.
    pub fn clashes(&self, uid: u32, gid: u32) -> Vec<IdClash> {
        let mut out: Vec<IdClash> = Vec::new();
        out.extend(
            self.users
                .iter()
                .filter(|a| a.id == uid)
                .cloned()
                .map(IdClash::User),
        );
        out.extend(
            self.groups
                .iter()
                .filter(|a| a.id == gid)
                .cloned()
                .map(IdClash::Group),
        );
        out.extend(
            self.sub_uids
                .iter()
                .filter(|r| r.contains(uid))
                .cloned()
                .map(IdClash::SubUid),
        );
        out.extend(
            self.sub_gids
                .iter()
                .filter(|r| r.contains(gid))
                .cloned()
                .map(IdClash::SubGid),
        );
        out
    }
}

/// One line of `/proc/self/mountinfo`, the fields a property reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MountEntry {
    pub mount_point: String,
    /// Per-mount options (`rw,nosuid,nodev,relatime`): the ones a bind of
    /// this mount inherits.
    pub options: Vec<String>,
    pub fs_type: String,
}

impl MountEntry {
    pub fn has(&self, option: &str) -> bool {
        self.options.iter().any(|o| o == option)
    }
}

/// Undoes the kernel's `\ooo` escapes in mountinfo paths.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let digits = bytes.get(i + 1..i + 4).unwrap_or_default();
            if digits.len() == 3 && digits.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(value) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mount_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let fields: Vec<&str> = left.split(' ').collect();
    if fields.len() < 6 {
        return None;
    }
    Some(MountEntry {
        mount_point: unescape(fields[4]),
        options: fields[5].split(',').map(str::to_owned).collect(),
        fs_type: right.split(' ').next().unwrap_or("").to_owned(),
    })
}

/// The mount that a path lies on, as seen in a mountinfo text: the last
/// (topmost) entry whose mount point is the path itself or its nearest
/// ancestor. `path` must be absolute and clean.
pub fn mount_of(mountinfo: &str, path: &str) -> Option<MountEntry> {
    let within = |mp: &str| {
        mp == path
            || mp == "/"
            || (path.starts_with(mp) && path.as_bytes().get(mp.len()) == Some(&b'/'))
    };
    let mut best: Option<MountEntry> = None;
    for entry in mountinfo.lines().filter_map(mount_line) {
        if !within(&entry.mount_point) {
            continue;
        }
        // A deeper mount point wins; at equal depth the later (upper) one.
        if best
            .as_ref()
            .is_none_or(|b| entry.mount_point.len() >= b.mount_point.len())
        {
            best = Some(entry);
        }
    }
    best
}

/// What the supervisor observed on the host, handed to the attestation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostObserved {
    pub accounts: HostAccounts,
    /// The mount the worktree lies on (see [`mount_of`]); `None` when the
    /// mount table could not be read.
    pub worktree_mount: Option<MountEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n# comment\nalice:x:1000:1000:Alice,,,:/home/alice:/bin/bash\nbroken line\n";
    const GROUP: &str = "root:x:0:\nalice:x:1000:\nstaff:x:50:alice\n";
    const SUBUID: &str = "alice:100000:65536\n";

    #[test]
    fn accounts_and_ranges_parse_and_clash() {
        let h = HostAccounts::parse(PASSWD, GROUP, SUBUID, SUBUID);
        assert_eq!(h.users.len(), 2);
        assert_eq!(h.groups.len(), 3);
        let c = h.clashes(1000, 1000);
        assert_eq!(c.len(), 2);
        assert!(c[0].to_string().contains("\"alice\""), "{}", c[0]);
        assert!(h.clashes(165535, 2_000_000_000)[0]
            .to_string()
            .contains("/etc/subuid"));
        assert!(h.clashes(165536, 165536).is_empty());
        assert!(h.clashes(2_000_000_000, 2_000_000_000).is_empty());
    }

    #[test]
    fn the_topmost_mount_of_a_path_is_found() {
        let info = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 254:0 /srv /srv rw,relatime - ext4 /dev/vda rw
43 27 254:0 /srv/st\\040x/worktrees/r1 /srv/st\\040x/worktrees/r1 rw,nosuid,nodev,relatime - ext4 /dev/vda rw
44 27 254:0 /srv/st\\040x/worktrees/r10 /srv/st\\040x/worktrees/r10 rw,relatime - ext4 /dev/vda rw
";
        let m = mount_of(info, "/srv/st x/worktrees/r1").unwrap();
        assert!(m.has("nosuid") && m.has("nodev"), "{m:?}");
        let m = mount_of(info, "/srv/st x/worktrees/r1/sub").unwrap();
        assert!(m.has("nosuid"));
        let m = mount_of(info, "/srv/other").unwrap();
        assert_eq!(m.mount_point, "/srv");
        assert!(!m.has("nosuid"));
        assert_eq!(mount_of(info, "/tmp").unwrap().mount_point, "/");
        assert_eq!(mount_of("garbage\n", "/tmp"), None);
    }

    #[test]
    fn unescape_leaves_plain_text_and_bad_escapes() {
        assert_eq!(unescape("a\\040b"), "a b");
        assert_eq!(unescape("a\\04"), "a\\04");
        assert_eq!(unescape("a\\9999"), "a\\9999");
        assert_eq!(unescape("\\"), "\\");
    }
}
