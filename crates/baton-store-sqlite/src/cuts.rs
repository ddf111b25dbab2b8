//! The writer's memory of how it last cut each tree's long bodies into
//! pieces (the last few, `baton_run::store::CUTS_PER_TREE`), so the next
//! body of the same tree (the next step of a process carrying a large
//! state) reuses the pieces it shares with any of them instead of
//! scanning, digesting and looking each of them up again
//! (`baton_run::store::split_after`).
//!
//! It is only a cache of what this connection committed: a group that does
//! not commit forgets everything, a prune forgets its trees, a compaction
//! forgets its tree's cuts but the snapshot's own (whose pieces the
//! snapshot references), and a commit by any other connection to the file
//! (another process) forgets everything before the cuts are next used
//! (`PRAGMA data_version`, read once by the first group that stores a long
//! body after it), so a remembered chunk id always names a stored chunk of
//! its tree.

use baton_run::store::{LastCut, LastCuts};
use rusqlite::Connection;

/// The bytes the cuts kept hold at most: their bodies (shared with the
/// records the engine wrote, so a tree costs nothing beyond its last few
/// bodies)
/// and their tables of pieces.
const MAX_BYTES: usize = 32 << 20;

/// The trees remembered at most.
const MAX_TREES: usize = 1024;

/// The last cut of each recently written tree, by tree key (no tag: what
/// tells this connection's commits from others' is `data_version`).
pub(crate) struct Cuts {
    cuts: LastCuts<i64, (), i64>,
    /// `PRAGMA data_version` when a group of this connection last used the
    /// cuts.
    version: Option<i64>,
    /// Whether the current group has checked `version` already.
    checked: bool,
}

impl Default for Cuts {
    fn default() -> Cuts {
        Cuts {
            cuts: LastCuts::new(MAX_TREES, MAX_BYTES),
            version: None,
            checked: false,
        }
    }
}

impl Cuts {
    /// At the start of a group: its first long body checks the version
    /// again ([`Cuts::check`]); a group without one reads nothing.
    pub(crate) fn begin(&mut self) {
        self.checked = false;
    }

    /// Before the cuts are used in a group, once, under its write lock:
    /// forgets everything if another connection committed since a group
    /// last used them (or if that cannot be told). The connection's own
    /// commits leave `data_version` as it is.
    pub(crate) fn check(&mut self, conn: &Connection) {
        if self.checked {
            return;
        }
        self.checked = true;
        let version = conn
            .query_row("PRAGMA data_version", [], |row| row.get::<_, i64>(0))
            .ok();
        if version.is_none() || version != self.version {
            self.clear();
        }
        self.version = version;
    }

    /// The last cuts of tree `key` remembered, most recent first.
    pub(crate) fn get(&self, key: i64) -> &[LastCut<i64>] {
        self.cuts.get(key, ())
    }

    /// Remembers `cut` as tree `key`'s last (beside a few before it),
    /// evicting the least recently written trees beyond the bounds.
    pub(crate) fn keep(&mut self, key: i64, cut: LastCut<i64>) {
        self.cuts.keep(key, (), cut);
    }

    /// Forgets tree `key` (its chunks may be deleted).
    pub(crate) fn forget(&mut self, key: i64) {
        self.cuts.forget(key);
    }

    /// Forgets every tree (a group did not commit).
    pub(crate) fn clear(&mut self) {
        self.cuts.clear();
    }
}

/// What the statements of one group add up as they store bodies: the
/// payload bytes stored (see `SqliteStore::bytes_written`) and the cuts
/// they reuse and leave behind.
pub(crate) struct Writing<'a> {
    pub(crate) bytes: u64,
    pub(crate) cuts: &'a mut Cuts,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn cut(len: usize) -> LastCut<i64> {
        LastCut::new(Arc::from(vec![7u8; len]), [(len, 1i64)]).expect("one piece")
    }

    #[test]
    fn a_commit_by_another_connection_forgets_everything() {
        let dir = std::env::temp_dir().join(format!("baton-cuts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cuts.db");
        let ours = Connection::open(&path).unwrap();
        let theirs = Connection::open(&path).unwrap();
        ours.execute_batch("CREATE TABLE IF NOT EXISTS t (x)")
            .unwrap();
        let mut cuts = Cuts::default();
        cuts.begin();
        cuts.check(&ours);
        cuts.keep(1, cut(10_000));
        ours.execute("INSERT INTO t VALUES (1)", []).unwrap();
        cuts.begin();
        cuts.check(&ours);
        assert!(!cuts.get(1).is_empty(), "our own commits keep the cuts");
        // A group with no long body checks nothing in between.
        cuts.begin();
        theirs.execute("INSERT INTO t VALUES (2)", []).unwrap();
        cuts.begin();
        cuts.check(&ours);
        assert!(
            cuts.get(1).is_empty(),
            "another connection's commit forgets them"
        );
        drop((ours, theirs));
        let _ = std::fs::remove_dir_all(dir);
    }
}
