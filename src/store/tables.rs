//! Every table replay-guard keeps (redb tables, and the PostgreSQL tables holding the same
//! bytes), and the versioned postcard records stored in them. The table constants and the
//! record encoding are used only under `store/`; the decoded records (`EffectRecord`,
//! `AuditRecord`, `SinkRecord`, ...) are what the read views hand to the inspectors and the
//! relay.

use std::borrow::Borrow;
use std::marker::PhantomData;
use std::ops::RangeBounds;

use redb::{
    AccessGuard, Key, ReadOnlyTable, ReadTransaction, ReadableTable, Table, TableDefinition,
    TableError, WriteTransaction,
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::StoreError;

/// Schema of the whole file; bump with a migration test and a CHANGELOG line. Version 2
/// added `AUDIT_KEYS`, version 3 `AUDIT_SOURCES`, version 4 their merged segments
/// (`MERGED`, `INDEX_MERGE`), version 5 the merged rows packed (`AUDIT_KEYS_PACKED`,
/// `AUDIT_SOURCES_PACKED`), version 6 effect records of version 4 (`RECORD_V4`), version 7
/// audit records of version 4, version 8 sink records of version 4 (`offered_to`,
/// `resent`), each of which a build before it cannot read; `upgrade` takes a store of
/// version 1 to 7 there.
pub const SCHEMA_VERSION: u32 = 8;
/// First byte of every stored record of the first version (every record type but
/// `EffectRecord`, `AuditRecord` and `SinkRecord`, at 4, and `WindowEntry` and `Meta`, at
/// 2: see `Record`).
pub const RECORD_V1: u8 = 1;
/// `AuditRecord` and `EffectRecord` since schema 3: the key and common reasons recomputed, not
/// stored (`stored`). `WindowEntry`: the digest left to the effect record (`WindowEntry`).
/// `Meta`: with `window_purged`.
pub const RECORD_V2: u8 = 2;
/// `EffectRecord` with the content digest (`stored`), which the window entry leaves out;
/// `AuditRecord` without its hash when the writer chained it at its index (`stored`).
pub const RECORD_V3: u8 = 3;
/// `EffectRecord` without its content digest when the digest is its payload's (`stored`);
/// `AuditRecord` without `prev_hash` when it is the hash of the entry stored before it
/// (`stored`).
pub const RECORD_V4: u8 = 4;

/// A stored record type: the format version its bytes start with, and how the bytes of an
/// older version of it decode. A changed record gets a new `VERSION`, keeps decoding every
/// older one (`decode_older`), and a test on bytes of the older version.
pub trait Record: Serialize + DeserializeOwned {
    /// The version byte `encode` writes.
    const VERSION: u8 = RECORD_V1;
    /// Decodes the postcard body of version `version` (older than `VERSION`); `None` for a
    /// version this build never wrote.
    fn decode_older(_version: u8, _body: &[u8]) -> Option<Result<Self, postcard::Error>> {
        None
    }
    /// Appends the postcard body of `VERSION` to `out` (by default the record's own serde form).
    fn encode_body(&self, out: Vec<u8>) -> Result<Vec<u8>, postcard::Error> {
        postcard::to_extend(self, out)
    }
    /// Decodes the postcard body of `VERSION` (by default the record's own serde form).
    fn decode_body(body: &[u8]) -> Result<Self, postcard::Error> {
        postcard::from_bytes(body)
    }
    /// `decode_older` for a record stored under the u64 key `index` (`None` for another key
    /// type), for an older version that leaves out what its key determines. By default
    /// `decode_older`.
    fn decode_older_at(
        version: u8,
        body: &[u8],
        _index: Option<u64>,
    ) -> Option<Result<Self, postcard::Error>> {
        Self::decode_older(version, body)
    }
    /// Decodes the postcard body of `VERSION` stored under the u64 key `index` (`None` for
    /// another key type): for a record whose stored form leaves out what its key determines
    /// (an audit entry's hash), or what the record stored at `index - 1` holds (an audit
    /// entry's `prev_hash`: that record's `chain_hash`, `prev`, if the caller has it;
    /// `Ok(None)` when it is needed and `prev` is `None`). By default `decode_body`.
    fn decode_body_at(
        body: &[u8],
        _index: Option<u64>,
        _prev: Option<&[u8; 32]>,
    ) -> Result<Option<Self>, postcard::Error> {
        Self::decode_body(body).map(Some)
    }
    /// What the record stored at the next u64 key takes as `decode_body_at`'s `prev`: an
    /// audit entry's hash. `None` for a record that is not chained.
    fn chain_hash(&self) -> Option<[u8; 32]> {
        None
    }
}

/// The chain hashes of records recently read from one table in one read transaction, by
/// index (`Opened::get_remembering`): at most `CHAIN_WALK_LIMIT`, the lowest indices
/// forgotten first.
#[derive(Default)]
pub struct ChainHashes(std::sync::Mutex<std::collections::BTreeMap<u64, [u8; 32]>>);

impl ChainHashes {
    fn get(&self, index: u64) -> Option<[u8; 32]> {
        self.0.lock().ok()?.get(&index).copied()
    }

    fn remember(&self, index: u64, hash: [u8; 32]) {
        if let Ok(mut held) = self.0.lock() {
            held.insert(index, hash);
            while held.len() as u64 > CHAIN_WALK_LIMIT {
                held.pop_first();
            }
        }
    }
}

/// How far back a read of a chained record follows the records that leave their
/// predecessor's hash to the record before them, before it calls the file damaged: the
/// writer stores the bytes at least every `stored::AUDIT_CHECKPOINT`th record.
pub const CHAIN_WALK_LIMIT: u64 = 4 * super::stored::AUDIT_CHECKPOINT;

/// (agency, source_id) -> source number.
pub const SOURCE_IDS: TableDefinition<(&str, &str), u64> = TableDefinition::new("source_ids");
/// source number -> `SourceRecord` (names, high-water mark, evicted floor).
pub const SOURCES: Records<u64, SourceRecord> = Records::new("sources", "sources", "no");
/// (source number, epoch, sequence) -> `WindowEntry`. Keyed by position so inserts are
/// per-source appends; the SHA-256 key is derived from the same fields and stored in the logs.
pub const WINDOW: Records<(u64, u64, u64), WindowEntry> =
    Records::new("window", "window_entries", "source_no, epoch, sequence");
/// The window's newest entries (redb only): `Tx::put_window` adds here (a source's second
/// and later entries of one transaction, and all of a source its batch names more than once,
/// go straight into `WINDOW`, for up to `redb_tx::DIRECT_SOURCES` sources) and a lookup
/// reads this table, then `WINDOW` less
/// `WINDOW_GONE`. Keyed like `WINDOW`, so a feed of
/// many sources dirties a page per source of this small table per commit instead of one of
/// the whole window; once it holds `WINDOW_MERGE_AT` entries they move to `WINDOW` together,
/// in key order, inside the commit that reached the mark (one write of each source's last
/// window page per merge, not per commit).
pub const WINDOW_RECENT: Records<(u64, u64, u64), WindowEntry> = Records::new(
    "window_recent",
    "window_entries",
    "source_no, epoch, sequence",
);
/// Positions removed from `WINDOW` (eviction, a release's replacement) but not yet deleted
/// there (redb only): a lookup that finds a position in `WINDOW` and here finds nothing.
/// Deleted from `WINDOW` together, in key order, when the two small tables reach
/// `WINDOW_MERGE_AT` (before `WINDOW_RECENT` moves in, so a position removed and put again
/// keeps its new entry): eviction, which removes one entry per source per commit at the
/// oldest end, writes each source's oldest window page once per move, not once per commit.
pub const WINDOW_GONE: TableDefinition<(u64, u64, u64), ()> = TableDefinition::new("window_gone");
/// Whether `WINDOW_GONE` names `key` in a read transaction (a file without the table: no).
pub fn window_gone(txn: &ReadTransaction, key: (u64, u64, u64)) -> Result<bool, StoreError> {
    match txn.open_table(WINDOW_GONE) {
        Ok(t) => Ok(t.get(key)?.is_some()),
        Err(TableError::TableDoesNotExist(_)) => Ok(false),
        Err(e) => Err(StoreError::redb(e)),
    }
}

/// How many entries `WINDOW_RECENT` and `WINDOW_GONE` gather before they are applied to
/// `WINDOW`.
pub const WINDOW_MERGE_AT: u64 = 16_384;
/// effect offset -> `EffectRecord`. Also the window's time index: the window holds exactly the
/// effects at offsets >= `Meta::window_start`, in first-seen order.
pub const EFFECTS: Records<u64, EffectRecord> = Records::new("effects", "effects", "effect_offset");
/// audit index -> `AuditRecord`, hash-chained.
/// Stored as `audit_log` from schema version 2 on (PostgreSQL: 3), the old name left to
/// `AUDIT_FENCE`.
pub const AUDIT: Records<u64, AuditRecord> =
    Records::new("audit", "audit_log", "audit_index").stored_as("audit_log");
/// An empty table of another type under the audit log's old name, `audit`: a process of a
/// build before schema version 2 still running on the file fails its next write transaction
/// (a table type mismatch) instead of appending entries the key index does not name. Made by
/// `upgrade`; not copied (a copy's meta record names its version, which such a build
/// refuses at open).
pub const AUDIT_FENCE: TableDefinition<u64, u64> = TableDefinition::new("audit");
/// (bucket, audit index) -> (): the audit log by idempotency key, so `explain` reads the
/// entries of one key instead of scanning the log. The bucket is the entry's block of
/// `AUDIT_KEY_BLOCK` consecutive indices in its high 32 bits and the key's first four bytes in
/// its low 32 (`audit_key_bucket`): one batch's rows all land in the newest block, a few pages
/// at the tail of the tree, so the index costs ingest little; a lookup reads one bucket per
/// block and checks each candidate's key in its entry. Written with the entry (`Tx::put_audit`)
/// for every entry that has a key; retention removes whole blocks (rows of the block it cut
/// into stay until that block is gone, and name no entry).
pub const AUDIT_KEYS: TableDefinition<(u64, u64), ()> = TableDefinition::new("audit_keys");
/// Audit indices per block of `AUDIT_KEYS`.
pub const AUDIT_KEY_BLOCK: u64 = 4096;

/// The first index of the `AUDIT_KEYS` block `index` lies in.
pub fn block_floor(index: u64) -> u64 {
    index - index % AUDIT_KEY_BLOCK
}

/// The `AUDIT_KEYS` bucket of the entry at `index` with `key`.
pub fn audit_key_bucket(index: u64, key: &[u8; 32]) -> u64 {
    audit_key_block_start(index / AUDIT_KEY_BLOCK) | u64::from(audit_key_prefix(key))
}

/// The low 32 bits of every `AUDIT_KEYS` bucket of `key`: its first four bytes.
pub fn audit_key_prefix(key: &[u8; 32]) -> u32 {
    u32::from_be_bytes([key[0], key[1], key[2], key[3]])
}

/// The lowest bucket of block `block` (blocks past 2^32, 17 trillion entries, would share
/// buckets with earlier ones: a lookup would still check every candidate's key).
pub fn audit_key_block_start(block: u64) -> u64 {
    block << 32
}

/// The `AUDIT_KEYS` blocks every index of which lies in `range` (removing the log's entries
/// up to `range.end()` removes those of `0..=end` from the index).
pub fn whole_blocks(range: &std::ops::RangeInclusive<u64>) -> std::ops::Range<u64> {
    let first = range.start().div_ceil(AUDIT_KEY_BLOCK);
    let end = range.end().saturating_add(1) / AUDIT_KEY_BLOCK;
    first..end.max(first)
}

/// (bucket, audit index) -> (epoch, sequence): the audit log by source, so `gaps --source`
/// reads one source's positions instead of scanning the log. The bucket is the entry's block
/// of `AUDIT_KEY_BLOCK` indices in its high 32 bits and its source's number (`SOURCE_IDS`) in
/// its low 32 (`audit_source_bucket`), like `AUDIT_KEYS`: a batch's rows land at the tail, a
/// lookup reads one bucket per block and needs no entry. An entry whose source has no number
/// when it is written (an operator's discard of a message whose source was never applied,
/// quarantined malformed and decoded again without the admission limits) goes under
/// `UNNUMBERED` with its block, after every numbered bucket, where a lookup reads the entries
/// to check their names. Written with every entry that has a source and a position (`Tx::put_audit`);
/// retention removes whole blocks of both kinds, as for `AUDIT_KEYS`.
pub const AUDIT_SOURCES: TableDefinition<(u64, u64), (u64, u64)> =
    TableDefinition::new("audit_sources");
/// The merged rows of `AUDIT_KEYS` (redb, schema version 5 on): (merged bucket of a key
/// group, audit index of the run's first row) -> a packed run of rows (`index_merge::pack`).
pub const AUDIT_KEYS_PACKED: TableDefinition<(u64, u64), &[u8]> =
    TableDefinition::new("audit_keys_packed");
/// The merged rows of `AUDIT_SOURCES`, packed the same way, one group per source number.
pub const AUDIT_SOURCES_PACKED: TableDefinition<(u64, u64), &[u8]> =
    TableDefinition::new("audit_sources_packed");

/// The high bit of an `AUDIT_SOURCES` bucket for an entry whose source has no number (or one
/// that does not fit in 32 bits); the block is in its low bits. As a PostgreSQL `bigint`
/// such a bucket is negative, and the unnumbered buckets keep their order among themselves.
pub const UNNUMBERED: u64 = 1 << 63;

/// The `AUDIT_SOURCES` bucket of the entry at `index` from source number `source_no`.
pub fn audit_source_bucket(index: u64, source_no: Option<u64>) -> u64 {
    let block = index / AUDIT_KEY_BLOCK;
    match source_no.and_then(|n| u32::try_from(n).ok()) {
        Some(n) => audit_key_block_start(block) | u64::from(n),
        None => UNNUMBERED | block,
    }
}

/// The bit of a merged bucket of `AUDIT_KEYS` or `AUDIT_SOURCES` (redb only): the rows of a
/// whole segment of `IndexMerge::blocks` blocks under one bucket per key prefix or source
/// number, `MERGED | segment << 32 | low 32 bits` (`merged_bucket`). A block's bucket stays
/// below it while blocks number under 2^30 (4.4 trillion entries). A lookup reads one bucket
/// per merged segment instead of one per block: ~140 reads at 20M entries instead of 4,883,
/// which is what a cold page cache pays for.
pub const MERGED: u64 = 1 << 62;
/// Blocks per merged segment of a new store (`IndexMerge::blocks`).
pub const SEGMENT_BLOCKS: u64 = 64;

/// The merged bucket of segment `segment` for the low 32 bits `low` (a key's first four
/// bytes, a source's number).
pub fn merged_bucket(segment: u64, low: u32) -> u64 {
    MERGED | segment << 32 | u64::from(low)
}

/// Segments a merged bucket can name (`ALL_SEGMENTS`: every one).
pub const SEGMENTS: u64 = 1 << 30;
pub const ALL_SEGMENTS: std::ops::Range<u64> = 0..SEGMENTS;

/// The merged buckets of segments `segments` (up to `SEGMENTS`).
pub fn merged_range(segments: &std::ops::Range<u64>) -> std::ops::Range<u64> {
    let bucket = |segment: u64| {
        if segment >= SEGMENTS {
            UNNUMBERED
        } else {
            merged_bucket(segment, 0)
        }
    };
    bucket(segments.start)..bucket(segments.end)
}

/// The bucket an index row would have in its block (`audit_key_bucket`'s form), whether it
/// is stored there or merged: what `verify` and a copy to PostgreSQL compare and write.
/// Unnumbered buckets are never merged and come back as they are.
pub fn block_bucket(bucket: u64, index: u64) -> u64 {
    if bucket & (MERGED | UNNUMBERED) == MERGED {
        audit_key_block_start(index / AUDIT_KEY_BLOCK) | (bucket & 0xFFFF_FFFF)
    } else {
        bucket
    }
}

/// How far the writer has merged the two audit indexes (redb only; "index_merge" in the
/// meta table). Absent: nothing merged, segments of `SEGMENT_BLOCKS`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexMerge {
    /// Blocks of `AUDIT_KEY_BLOCK` entries per segment; fixed when the record is first written.
    pub blocks: u64,
    pub keys: MergeMark,
    pub sources: MergeMark,
}

impl Default for IndexMerge {
    fn default() -> Self {
        IndexMerge::with_blocks(SEGMENT_BLOCKS)
    }
}

impl IndexMerge {
    pub fn with_blocks(blocks: u64) -> IndexMerge {
        IndexMerge {
            blocks: blocks.max(1),
            keys: MergeMark::default(),
            sources: MergeMark::default(),
        }
    }

    /// Audit entries per segment.
    pub fn segment_entries(&self) -> u64 {
        self.blocks * AUDIT_KEY_BLOCK
    }

    /// The segment block `block` lies in.
    pub fn segment_of(&self, block: u64) -> u64 {
        block / self.blocks
    }

    /// The blocks of segment `segment`.
    pub fn blocks_of(&self, segment: u64) -> std::ops::Range<u64> {
        segment * self.blocks..(segment + 1) * self.blocks
    }
}

/// One index's merge: every numbered row of a segment below `segment` is under its merged
/// bucket, none in its block; of segment `segment`, the rows whose (low 32 bits of the
/// bucket, audit index) is below `next` are merged, the others still in their blocks (a
/// lookup reads both there); rows of later segments are in their blocks.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeMark {
    pub segment: u64,
    pub next: (u64, u64),
}

impl MergeMark {
    /// Whether a lookup of segment `segment` reads its merged bucket, and its blocks.
    pub fn reads(&self, segment: u64) -> (bool, bool) {
        (segment <= self.segment, segment >= self.segment)
    }
}

/// "index_merge" -> `IndexMerge`.
pub const INDEX_MERGE: MetaEntry<IndexMerge> = MetaEntry::new("index_merge");

/// The two bucket ranges of `AUDIT_SOURCES` that hold the rows of blocks `blocks`: the
/// numbered buckets, then the unnumbered ones.
pub fn audit_source_ranges(blocks: &std::ops::Range<u64>) -> [std::ops::Range<u64>; 2] {
    [
        audit_key_block_start(blocks.start)..audit_key_block_start(blocks.end),
        UNNUMBERED | blocks.start..UNNUMBERED | blocks.end,
    ]
}

/// A row of `AUDIT_SOURCES`: ((bucket, audit index), (epoch, sequence)).
pub type SourceRow = ((u64, u64), (u64, u64));

/// The `AUDIT_SOURCES` row of the entry `record` at `index` (its source numbered
/// `source_no`), if it names a source and a position: ((bucket, index), (epoch, sequence)).
pub fn audit_source_row(
    index: u64,
    record: &AuditRecord,
    source_no: Option<u64>,
) -> Option<SourceRow> {
    match (
        &record.agency,
        &record.source_id,
        record.epoch,
        record.sequence,
    ) {
        (Some(_), Some(_), Some(epoch), Some(sequence)) => Some((
            (audit_source_bucket(index, source_no), index),
            (epoch, sequence),
        )),
        _ => None,
    }
}

/// quarantine id -> `QuarantineRecord`.
pub const QUARANTINE: Records<u64, QuarantineRecord> =
    Records::new("quarantine", "quarantine", "id");
/// quarantine fingerprint -> quarantine id, so replays of the same bytes do not grow it.
pub const QUARANTINE_FP: TableDefinition<&[u8; 32], u64> = TableDefinition::new("quarantine_fp");
/// quarantine id -> its fingerprint, so pruning or resolving a quarantined message also
/// removes its `QUARANTINE_FP` entry.
pub const QUARANTINE_FP_BY_ID: TableDefinition<u64, &[u8; 32]> =
    TableDefinition::new("quarantine_fp_by_id");
/// burst number -> `BurstRecord`: failover replay bursts `run` absorbed (for `stats`).
pub const REPLAY_BURSTS: Records<u64, BurstRecord> =
    Records::new("replay_bursts", "replay_bursts", "no");
/// sink name -> `SinkRecord`: a relay sink's durable cursor. Written only by
/// `store::relay`.
pub const SINK_CURSORS: Records<&str, SinkRecord> =
    Records::new("sink_cursors", "sink_cursors", "name");
/// (sink name, effect offset) -> `ParkedRecord`: events a sink's receiver refused for good.
pub const SINK_PARKED: Records<(&str, u64), ParkedRecord> =
    Records::new("sink_parked", "sink_parked", "name, effect_offset");
/// (sink name, entry number) -> `LedgerRecord`: how every offset below a sink's cursor got
/// there (delivered, parked, passed over by an operator), for `verify` and `relay status`.
/// Written only by `store::relay`, in the transaction that moves the cursor.
pub const SINK_LEDGER: Records<(&str, u64), LedgerRecord> =
    Records::new("sink_ledger", "sink_ledger", "name, seq");
/// The meta table: one record of its own type under each name (`META`, `RETENTION`,
/// `COUNTS`).
pub const META_TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// "meta" -> `Meta`.
pub const META: MetaEntry<Meta> = MetaEntry::new("meta");
/// "retention" -> `RetentionMarks`.
pub const RETENTION: MetaEntry<RetentionMarks> = MetaEntry::new("retention");
/// "counts" -> `Counters`: audit entries per outcome code since the database was created
/// (retention does not lower them).
pub const COUNTS: MetaEntry<Counters> = MetaEntry::new("counts");
/// "identity" -> `StoreIdentity`: the store's random id, which a sink's own cursor names.
pub const IDENTITY: MetaEntry<StoreIdentity> = MetaEntry::new("identity");
/// "upstream" -> `UpstreamLosses`: the gaps and lost broker sessions `run` and `ingest`
/// reported, bounded (`store::upstream`); absent until the first.
pub const UPSTREAM: MetaEntry<UpstreamLosses> = MetaEntry::new("upstream");

/// One column value of a stored key or value, as a whole-store copy hands it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell<'a> {
    Int(u64),
    Text(&'a str),
    Bytes(&'a [u8]),
}

/// A key or value type of a stored table, split into the columns PostgreSQL keeps it in
/// (`migrate --from`); a redb-to-redb copy (`backup`) copies it whole.
pub trait Cells: redb::Value + 'static {
    /// Each column's PostgreSQL array type, in column order.
    const PG_TYPES: &'static [&'static str];
    /// Hands each column of `v` to `out`, in column order.
    fn cells<'a>(v: Self::SelfType<'a>, out: &mut dyn FnMut(Cell<'a>));
}

impl Cells for u64 {
    const PG_TYPES: &'static [&'static str] = &["bigint[]"];
    fn cells<'a>(v: u64, out: &mut dyn FnMut(Cell<'a>)) {
        out(Cell::Int(v));
    }
}

impl Cells for &'static str {
    const PG_TYPES: &'static [&'static str] = &["text[]"];
    fn cells<'a>(v: &'a str, out: &mut dyn FnMut(Cell<'a>)) {
        out(Cell::Text(v));
    }
}

impl Cells for &'static [u8] {
    const PG_TYPES: &'static [&'static str] = &["bytea[]"];
    fn cells<'a>(v: &'a [u8], out: &mut dyn FnMut(Cell<'a>)) {
        out(Cell::Bytes(v));
    }
}

impl Cells for &'static [u8; 32] {
    const PG_TYPES: &'static [&'static str] = &["bytea[]"];
    fn cells<'a>(v: &'a [u8; 32], out: &mut dyn FnMut(Cell<'a>)) {
        out(Cell::Bytes(v));
    }
}

impl Cells for (&'static str, &'static str) {
    const PG_TYPES: &'static [&'static str] = &["text[]", "text[]"];
    fn cells<'a>(v: (&'a str, &'a str), out: &mut dyn FnMut(Cell<'a>)) {
        out(Cell::Text(v.0));
        out(Cell::Text(v.1));
    }
}

impl Cells for (&'static str, u64) {
    const PG_TYPES: &'static [&'static str] = &["text[]", "bigint[]"];
    fn cells<'a>(v: (&'a str, u64), out: &mut dyn FnMut(Cell<'a>)) {
        out(Cell::Text(v.0));
        out(Cell::Int(v.1));
    }
}

impl Cells for (u64, u64) {
    const PG_TYPES: &'static [&'static str] = &["bigint[]", "bigint[]"];
    fn cells<'a>(v: (u64, u64), out: &mut dyn FnMut(Cell<'a>)) {
        out(Cell::Int(v.0));
        out(Cell::Int(v.1));
    }
}

/// A table whose key is all it holds (PostgreSQL: no value columns).
impl Cells for () {
    const PG_TYPES: &'static [&'static str] = &[];
    fn cells<'a>(_: (), _: &mut dyn FnMut(Cell<'a>)) {}
}

impl Cells for (u64, u64, u64) {
    const PG_TYPES: &'static [&'static str] = &["bigint[]", "bigint[]", "bigint[]"];
    fn cells<'a>(v: (u64, u64, u64), out: &mut dyn FnMut(Cell<'a>)) {
        out(Cell::Int(v.0));
        out(Cell::Int(v.1));
        out(Cell::Int(v.2));
    }
}

/// One table of the store as a whole-store copy sees it: the redb definition (stored bytes)
/// and the PostgreSQL table and columns (key columns, then value columns) holding the same.
pub struct WholeTable<K: Cells + Key, V: Cells> {
    pub def: TableDefinition<'static, K, V>,
    pub pg_table: &'static str,
    pub pg_columns: [&'static str; 2],
    /// Its redb name in a database of an older schema, if it had another.
    pub formerly: Option<&'static str>,
}

impl<K: Cells + Key, V: Cells> WholeTable<K, V> {
    /// Opens the table in `txn` under its name, or the name it had in an older schema;
    /// `None` when the database has neither (written before the table existed).
    pub fn open_in(
        &self,
        txn: &ReadTransaction,
    ) -> Result<Option<ReadOnlyTable<K, V>>, StoreError> {
        use redb::TableHandle as _;
        for name in std::iter::once(self.def.name()).chain(self.formerly) {
            match txn.open_table(TableDefinition::<K, V>::new(name)) {
                Ok(table) => return Ok(Some(table)),
                Err(TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(StoreError::redb(e)),
            }
        }
        Ok(None)
    }
}

/// A whole-store copy (`backup`, `migrate --from`): `table` is called once per table.
pub trait CopyTable {
    fn table<K: Cells + Key, V: Cells>(&mut self, t: WholeTable<K, V>) -> Result<(), StoreError>;
}

/// Calls `copy.table` for every table of the store. **The one list** of tables: `backup`
/// and `migrate --from` both walk it, `unlisted_tables` refuses a file holding one it lacks,
/// and a test checks that a new store holds exactly these.
pub fn for_each_table(copy: &mut impl CopyTable) -> Result<(), StoreError> {
    fn records<K: Cells + KeyText, R>(r: Records<K, R>) -> WholeTable<K, &'static [u8]> {
        WholeTable {
            def: r.raw(),
            pg_table: r.pg_table,
            pg_columns: [r.pg_key, "record"],
            formerly: r.formerly(),
        }
    }
    copy.table(WholeTable {
        def: META_TABLE,
        pg_table: "meta",
        pg_columns: ["name", "record"],
        formerly: None,
    })?;
    copy.table(WholeTable {
        def: SOURCE_IDS,
        pg_table: "source_ids",
        pg_columns: ["agency, source_id", "no"],
        formerly: None,
    })?;
    copy.table(records(SOURCES))?;
    copy.table(records(WINDOW))?;
    copy.table(records(WINDOW_RECENT))?;
    // Read with `WINDOW` by a copy into PostgreSQL (whose window is one table), copied as it
    // is by `backup`.
    copy.table(WholeTable {
        def: WINDOW_GONE,
        pg_table: "",
        pg_columns: ["", ""],
        formerly: None,
    })?;
    copy.table(records(EFFECTS))?;
    copy.table(records(AUDIT))?;
    copy.table(WholeTable {
        def: AUDIT_KEYS,
        pg_table: "audit_keys",
        pg_columns: ["bucket, audit_index", ""],
        formerly: None,
    })?;
    copy.table(WholeTable {
        def: AUDIT_SOURCES,
        pg_table: "audit_sources",
        pg_columns: ["bucket, audit_index", "epoch, sequence"],
        formerly: None,
    })?;
    // Copied as they are by `backup`; a copy into PostgreSQL writes their rows into its
    // `audit_keys` and `audit_sources` under their blocks' buckets instead.
    copy.table(WholeTable {
        def: AUDIT_KEYS_PACKED,
        pg_table: "",
        pg_columns: ["", ""],
        formerly: None,
    })?;
    copy.table(WholeTable {
        def: AUDIT_SOURCES_PACKED,
        pg_table: "",
        pg_columns: ["", ""],
        formerly: None,
    })?;
    copy.table(records(QUARANTINE))?;
    copy.table(WholeTable {
        def: QUARANTINE_FP,
        pg_table: "quarantine_fp",
        pg_columns: ["fp", "id"],
        formerly: None,
    })?;
    copy.table(WholeTable {
        def: QUARANTINE_FP_BY_ID,
        pg_table: "quarantine_fp_by_id",
        pg_columns: ["id", "fp"],
        formerly: None,
    })?;
    copy.table(records(REPLAY_BURSTS))?;
    copy.table(records(SINK_CURSORS))?;
    copy.table(records(SINK_PARKED))?;
    copy.table(records(SINK_LEDGER))?;
    Ok(())
}

/// The names of `for_each_table`'s tables.
pub fn table_names() -> Vec<String> {
    struct Names(Vec<String>);
    impl CopyTable for Names {
        fn table<K: Cells + Key, V: Cells>(
            &mut self,
            t: WholeTable<K, V>,
        ) -> Result<(), StoreError> {
            use redb::TableHandle as _;
            self.0.push(t.def.name().to_string());
            Ok(())
        }
    }
    let mut names = Names(Vec::new());
    // `Names::table` never fails.
    let _ = for_each_table(&mut names);
    names.0
}

/// Tables in `txn`'s file that `for_each_table` does not list (written by a newer build): a
/// whole-store copy refuses such a file rather than leave them behind.
pub fn unlisted_tables(txn: &ReadTransaction) -> Result<Vec<String>, StoreError> {
    use redb::{MultimapTableHandle as _, TableHandle as _};
    let mut known = table_names();
    // The old names of renamed tables (a file of an older schema), and the fence.
    known.extend(AUDIT.formerly().map(str::to_string));
    let mut extra: Vec<String> = txn
        .list_tables()?
        .map(|t| t.name().to_string())
        .filter(|n| !known.contains(n))
        .collect();
    extra.extend(txn.list_multimap_tables()?.map(|t| t.name().to_string()));
    Ok(extra)
}

/// A redb table whose values are versioned records of one type: its key type `K`, its record
/// type `R`, its name, and the PostgreSQL table (and key columns) holding the same records,
/// all named here once. Callers open it and get and put `R`s; none passes a table name or
/// decodes bytes.
///
/// The stored value type stays redb's `&[u8]` (a record's version byte, then postcard): redb
/// keeps each table's value type name in the file and refuses a different one, and `&[u8]`'s
/// name is one a type of ours cannot take, so a `redb::Value` of our own would change the
/// on-disk format. The typing lives here instead.
pub struct Records<K: Key + 'static, R> {
    name: &'static str,
    /// The redb table holding them in this schema (`name` unless renamed: `stored_as`).
    stored: &'static str,
    pg_table: &'static str,
    pg_key: &'static str,
    types: PhantomData<fn() -> (K, R)>,
}

impl<K: Key + 'static, R> Clone for Records<K, R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K: Key + 'static, R> Copy for Records<K, R> {}

impl<K: KeyText, R> Records<K, R> {
    pub const fn new(name: &'static str, pg_table: &'static str, pg_key: &'static str) -> Self {
        Records {
            name,
            stored: name,
            pg_table,
            pg_key,
            types: PhantomData,
        }
    }

    /// The same records in the redb table `table` from this schema on (a database of an
    /// older schema, read-only, still holds them under `name`).
    pub const fn stored_as(self, table: &'static str) -> Self {
        Records {
            stored: table,
            ..self
        }
    }

    /// The redb table holding them in this schema.
    pub fn stored(&self) -> &'static str {
        self.stored
    }

    /// The table holding these records in a database of an older schema, if it had another
    /// name then.
    pub fn formerly(&self) -> Option<&'static str> {
        (self.stored != self.name).then_some(self.name)
    }

    /// The records' name, as errors name them (the redb table's name, unless renamed).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The PostgreSQL table holding these records.
    pub fn pg_table(&self) -> &'static str {
        self.pg_table
    }

    /// Its key column(s), in key order.
    pub fn pg_key(&self) -> &'static str {
        self.pg_key
    }

    /// The table as stored bytes: only for copying records unchanged (`migrate --from`) and
    /// for creating the table.
    pub fn raw(&self) -> TableDefinition<'static, K, &'static [u8]> {
        TableDefinition::new(self.stored)
    }

    /// Opens the table in a read transaction (in a database of an older schema, under the
    /// name it had there).
    pub fn open(&self, txn: &ReadTransaction) -> Result<Opened<ReadOnly<K>, K, R>, StoreError> {
        match self.open_if_present(txn)? {
            Some(opened) => Ok(opened),
            None => Err(StoreError::redb(TableError::TableDoesNotExist(
                self.stored.to_string(),
            ))),
        }
    }

    /// Opens the table in a read transaction; `None` for a database last written before the
    /// table existed.
    pub fn open_if_present(
        &self,
        txn: &ReadTransaction,
    ) -> Result<Option<Opened<ReadOnly<K>, K, R>>, StoreError> {
        for name in std::iter::once(self.stored).chain(self.formerly()) {
            match txn.open_table(TableDefinition::<K, &[u8]>::new(name)) {
                Ok(table) => {
                    return Ok(Some(Opened {
                        table,
                        records: *self,
                    }));
                }
                Err(TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(StoreError::redb(e)),
            }
        }
        Ok(None)
    }

    /// Opens (or creates) the table in a write transaction.
    pub fn open_mut<'t>(
        &self,
        txn: &'t WriteTransaction,
    ) -> Result<Writable<'t, K, R>, StoreError> {
        let table = txn.open_table(self.raw())?;
        Ok(Opened {
            table,
            records: *self,
        })
    }
}

impl<K: KeyText, R> Records<K, R> {
    /// The error for a record at `key` that should be there and is not.
    pub fn missing(&self, key: &K::SelfType<'_>, why: &str) -> RecordError {
        RecordError {
            table: self.name,
            key: Shown::<K>(key).to_string(),
            why: why.into(),
        }
    }
}

impl<K: KeyText, R: Record> Records<K, R> {
    /// Decodes the record stored at `key`.
    pub fn decode(&self, key: &K::SelfType<'_>, bytes: &[u8]) -> Result<R, RecordError> {
        decode(self.name, Shown::<K>(key), K::index(key), bytes)
    }
}

impl<R: Record> Records<u64, R> {
    /// Decodes only the leading fields `H` of the record stored at `key`.
    pub fn head<H: HeadOf<R>>(&self, key: u64, bytes: &[u8]) -> Result<H, RecordError> {
        decode_head(self.name, key, bytes, R::VERSION)
    }
}

impl<K: KeyText, R: Record> Records<K, R> {
    pub fn encode(&self, record: &R) -> Vec<u8> {
        encode(record)
    }
}

/// A read-only redb table of records.
pub type ReadOnly<K> = ReadOnlyTable<K, &'static [u8]>;

/// A table of `Records<K, R>` open in write transaction `'t`.
pub type Writable<'t, K, R> = Opened<Table<'t, K, &'static [u8]>, K, R>;

/// An open table of `Records<K, R>` (`T`: redb's read-only or writable table). Its own
/// methods take and give `R`s; redb's (`len`, `stats`, `retain_in`) are reached through
/// `Deref`.
pub struct Opened<T, K: Key + 'static, R> {
    table: T,
    records: Records<K, R>,
}

impl<T, K: Key + 'static, R> std::ops::Deref for Opened<T, K, R> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.table
    }
}

impl<T, K: Key + 'static, R> std::ops::DerefMut for Opened<T, K, R> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.table
    }
}

/// One stored record and its key guard (`.value()` gives the key).
pub type Entry<'a, K, R> = Result<(AccessGuard<'a, K>, R), StoreError>;

impl<T, K, R> Opened<T, K, R>
where
    T: ReadableTable<K, &'static [u8]>,
    K: KeyText,
    R: Record,
{
    /// The record at `key`.
    pub fn get<'k>(&self, key: impl Borrow<K::SelfType<'k>>) -> Result<Option<R>, StoreError> {
        let key = key.borrow();
        match self.table.get(key)? {
            Some(g) => Ok(Some(self.decode_chained(key, g.value(), None, None)?)),
            None => Ok(None),
        }
    }

    /// `get`, taking the chain hashes of the records before it from `chain` where it holds
    /// them and leaving there those it computes: `chain` must only ever be used with this
    /// table in this transaction (a `Snapshot`'s). Reads of nearby records one at a time
    /// (`verify` reading each effect's audit entry) then walk back no further than the last.
    pub fn get_remembering<'k>(
        &self,
        key: impl Borrow<K::SelfType<'k>>,
        chain: &ChainHashes,
    ) -> Result<Option<R>, StoreError> {
        let key = key.borrow();
        match self.table.get(key)? {
            Some(g) => Ok(Some(self.decode_chained(
                key,
                g.value(),
                None,
                Some(chain),
            )?)),
            None => Ok(None),
        }
    }

    /// The records with keys in `range`, in key order (`.rev()` for the other way, where
    /// each chained record reads the records before it again: `decode_chained`).
    pub fn range<'k, KR: Borrow<K::SelfType<'k>> + 'k>(
        &self,
        range: impl RangeBounds<KR> + 'k,
    ) -> Result<impl DoubleEndedIterator<Item = Entry<'_, K, R>> + '_, StoreError> {
        let entries = self.table.range(range)?;
        // The chain hash of the record just read, for the next one (in key order).
        let mut last: Option<(u64, [u8; 32])> = None;
        Ok(entries.map(move |item| {
            let (k, v) = item?;
            let index = K::index(&k.value());
            let prev = match (index, last) {
                (Some(i), Some((j, hash))) if j.checked_add(1) == Some(i) => Some(hash),
                _ => None,
            };
            let record = self.decode_chained(&k.value(), v.value(), prev.as_ref(), None)?;
            last = index.zip(record.chain_hash());
            Ok((k, record))
        }))
    }

    /// Decodes the record stored at `key` as `bytes`, given the chain hash of the record
    /// at the index before (`prev`) if known. A record that leaves its `prev_hash` to that
    /// record and was not given it (an audit entry read alone) takes it from the records
    /// before it: back to the first that holds its own (at most `AUDIT_CHECKPOINT` back, as
    /// the writer stores them), then forward.
    fn decode_chained(
        &self,
        key: &K::SelfType<'_>,
        bytes: &[u8],
        prev: Option<&[u8; 32]>,
        chain: Option<&ChainHashes>,
    ) -> Result<R, StoreError> {
        let index = K::index(key);
        let name = self.records.name;
        let remembered = |at: u64| chain.and_then(|c| c.get(at));
        let remember = |at: u64, r: &R| {
            if let (Some(c), Some(h)) = (chain, r.chain_hash()) {
                c.remember(at, h);
            }
        };
        let prev = prev
            .copied()
            .or_else(|| index.and_then(|i| i.checked_sub(1)).and_then(remembered));
        if let Some(r) = decode_after(name, &Shown::<K>(key), index, prev.as_ref(), bytes)? {
            if let Some(i) = index {
                remember(i, &r);
            }
            return Ok(r);
        }
        let err = |why: String| RecordError {
            table: name,
            key: Shown::<K>(key).to_string(),
            why,
        };
        let Some(index) = index else {
            return Err(err(format!("{CHAINED_ALONE} read")).into());
        };
        // The records before it that leave their predecessor's hash out too, newest first.
        let mut before: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut hash = loop {
            // Entry 0 has no entry before it: one that leaves its prev_hash out is damage.
            let Some(at) = index.checked_sub(before.len() as u64 + 1) else {
                return Err(err(format!("{CHAINED_ALONE} there (damaged)")).into());
            };
            if let Some(h) = remembered(at) {
                break h;
            }
            let found = match K::at_index(at) {
                Some(k) => self.table.get(k)?,
                None => None,
            };
            let Some(g) = found else {
                return Err(err(format!(
                    "entry {at}, whose hash it takes as its prev_hash, is missing (damaged)"
                ))
                .into());
            };
            match decode_after::<R>(name, &at, Some(at), None, g.value())? {
                Some(r) => match r.chain_hash() {
                    Some(h) => break h,
                    None => return Err(err(format!("{CHAINED_ALONE} chained")).into()),
                },
                None if (before.len() as u64) < CHAIN_WALK_LIMIT => {
                    before.push((at, g.value().to_vec()));
                }
                None => {
                    return Err(err(format!(
                        "{CHAINED_ALONE} found within {CHAIN_WALK_LIMIT} entries (damaged)"
                    ))
                    .into());
                }
            }
        };
        for (at, bytes) in before.iter().rev() {
            let r = decode_after::<R>(name, at, Some(*at), Some(&hash), bytes)?;
            hash = r
                .and_then(|r| r.chain_hash())
                .ok_or_else(|| err(format!("{CHAINED_ALONE} chained (entry {at})")))?;
            if let Some(c) = chain {
                c.remember(*at, hash);
            }
        }
        let r = decode_after(name, &Shown::<K>(key), Some(index), Some(&hash), bytes)?
            .ok_or_else(|| err(format!("{CHAINED_ALONE} chained")))?;
        remember(index, &r);
        Ok(r)
    }

    /// Every record, in key order.
    pub fn all(&self) -> Result<impl DoubleEndedIterator<Item = Entry<'_, K, R>> + '_, StoreError> {
        self.range::<K::SelfType<'_>>(..)
    }
}

impl<T, R> Opened<T, u64, R>
where
    T: ReadableTable<u64, &'static [u8]>,
    R: Record,
{
    /// The leading fields `H` of the records with keys in `range`, in key order (`.rev()`
    /// for the other way), each with its key; the rest of each record is not decoded.
    pub fn heads<H: HeadOf<R>>(
        &self,
        range: impl RangeBounds<u64> + 'static,
    ) -> Result<impl DoubleEndedIterator<Item = Result<(u64, H), StoreError>> + '_, StoreError>
    {
        let records = self.records;
        let entries = self.table.range(range)?;
        Ok(entries.map(move |item| {
            let (k, v) = item?;
            Ok((k.value(), records.head(k.value(), v.value())?))
        }))
    }
}

impl<T> Opened<T, u64, EffectRecord>
where
    T: ReadableTable<u64, &'static [u8]>,
{
    /// The content digest the effect at `offset` holds (`None`: no such effect, one of a
    /// record version before 3, or one of version 4 whose payload, which gives its digest,
    /// no longer parses), without decoding the rest of it unless the payload gives it.
    pub fn digest(&self, offset: u64) -> Result<Option<[u8; 32]>, StoreError> {
        match self.table.get(offset)? {
            Some(g) => Ok(effect_digest(offset, g.value())?),
            None => Ok(None),
        }
    }
}

impl<T> Opened<T, u64, EffectRecord>
where
    T: ReadableTable<u64, &'static [u8]>,
{
    /// `digest`, or, for an effect that holds none because its payload (which gives its
    /// digest, record version 4) no longer parses, the digest its applying audit entry
    /// recorded, read from `audit`: a damaged payload does not stop the window from telling a
    /// replay of the message that was applied.
    pub fn digest_or_audited<A>(
        &self,
        audit: &Opened<A, u64, AuditRecord>,
        offset: u64,
    ) -> Result<Option<[u8; 32]>, StoreError>
    where
        A: ReadableTable<u64, &'static [u8]>,
    {
        match self.table.get(offset)? {
            Some(g) => effect_digest_or_audited(offset, g.value(), |index| audit.get(index)),
            None => Ok(None),
        }
    }
}

/// The digest of the effect stored at `offset` as `bytes` (`effect_digest`), or, when it
/// gives none because its payload (which gives its digest, record version 4) no longer
/// parses, the digest its applying audit entry recorded (`audit(index)`: that entry, if
/// kept). Both stores resolve a window entry that leaves its digest to its effect with it.
pub fn effect_digest_or_audited(
    offset: u64,
    bytes: &[u8],
    audit: impl FnOnce(u64) -> Result<Option<AuditRecord>, StoreError>,
) -> Result<Option<[u8; 32]>, StoreError> {
    if let Some(d) = effect_digest(offset, bytes)? {
        return Ok(Some(d));
    }
    let effect = EFFECTS.decode(&offset, bytes)?;
    Ok(audit(effect.audit_index)?
        .filter(|a| a.effect_offset == Some(offset))
        .and_then(|a| a.digest))
}

/// A stored audit entry as a store whose readers take each entry alone holds it (PostgreSQL,
/// filled by `migrate --from`): the entry stored at `index` as `bytes`, after an entry whose
/// hash is `prev` (the copy goes in index order; `None` for the first), and its hash, for
/// the next. The bytes are `None` when they hold their `prev_hash` already, else the entry
/// encoded again holding it (record version 4 leaves it to the entry before).
pub fn audit_standalone(
    index: u64,
    bytes: &[u8],
    prev: Option<&[u8; 32]>,
) -> Result<(Option<Vec<u8>>, [u8; 32]), StoreError> {
    let name = AUDIT.name;
    if let Some(r) = decode_after::<AuditRecord>(name, &index, Some(index), None, bytes)? {
        return Ok((None, r.hash));
    }
    let r =
        decode_after::<AuditRecord>(name, &index, Some(index), prev, bytes)?.ok_or_else(|| {
            RecordError {
                table: name,
                key: index.to_string(),
                why: format!("{CHAINED_ALONE} copied before it"),
            }
        })?;
    // Its own hash is still the one its index gives: left out as before.
    super::stored::note_chained(index, &r.hash, false);
    Ok((Some(AUDIT.encode(&r)), r.hash))
}

/// Whether the stored audit entry `bytes` leaves its `prev_hash` to the entry before it
/// (record version 4).
pub fn audit_leaves_prev_hash(bytes: &[u8]) -> bool {
    matches!(
        decode_after::<AuditRecord>(AUDIT.name, &0, Some(0), None, bytes),
        Ok(None)
    )
}

/// The content digest a stored effect record holds (record version 3 on), read from its
/// leading fields, or from version 4 on recomputed from its payload where it left it out.
pub fn effect_digest(offset: u64, bytes: &[u8]) -> Result<Option<[u8; 32]>, RecordError> {
    let read = match bytes.split_first() {
        Some((&RECORD_V4, body)) => super::stored::effect_digest(body),
        Some((&RECORD_V3, body)) => super::stored::effect_digest_v3(body),
        _ => return Ok(None),
    };
    read.map_err(|e| RecordError {
        table: EFFECTS.name(),
        key: offset.to_string(),
        why: format!("postcard: {e}"),
    })
}

impl<K, R> Opened<Table<'_, K, &'static [u8]>, K, R>
where
    K: KeyText,
    R: Record,
{
    /// Stores `record` at `key`, encoded in `buf` (reused across puts); whether a record was
    /// there before.
    pub fn put<'k>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        record: &R,
        buf: &mut Vec<u8>,
    ) -> Result<bool, StoreError> {
        let was = self.table.insert(key, encode_into(record, buf))?;
        Ok(was.is_some())
    }

    /// Removes the record at `key` and returns it.
    pub fn take<'k>(&mut self, key: impl Borrow<K::SelfType<'k>>) -> Result<Option<R>, StoreError> {
        let key = key.borrow();
        let records = self.records;
        match self.table.remove(key)? {
            Some(g) => Ok(Some(records.decode(key, g.value())?)),
            None => Ok(None),
        }
    }
}

/// One record of the meta table: its name there and its type.
pub struct MetaEntry<R> {
    key: &'static str,
    types: PhantomData<fn() -> R>,
}

impl<R> Clone for MetaEntry<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R> Copy for MetaEntry<R> {}

impl<R: Record> MetaEntry<R> {
    pub const fn new(key: &'static str) -> Self {
        MetaEntry {
            key,
            types: PhantomData,
        }
    }

    /// Its name in the meta table (the PostgreSQL `meta.name`).
    pub fn key(&self) -> &'static str {
        self.key
    }

    pub fn decode(&self, bytes: &[u8]) -> Result<R, RecordError> {
        decode("meta", self.key, None, bytes)
    }

    pub fn encode(&self, record: &R) -> Vec<u8> {
        encode(record)
    }

    /// The record, read from an open meta table.
    pub fn get(
        &self,
        t: &impl ReadableTable<&'static str, &'static [u8]>,
    ) -> Result<Option<R>, StoreError> {
        match t.get(self.key)? {
            Some(g) => Ok(Some(self.decode(g.value())?)),
            None => Ok(None),
        }
    }

    /// The record, read in a read transaction.
    pub fn read(&self, txn: &ReadTransaction) -> Result<Option<R>, StoreError> {
        self.get(&txn.open_table(META_TABLE)?)
    }

    /// Stores the record in an open meta table, encoded in `buf`.
    pub fn put(
        &self,
        t: &mut Table<'_, &'static str, &'static [u8]>,
        record: &R,
        buf: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        t.insert(self.key, encode_into(record, buf))?;
        Ok(())
    }

    /// The error for a store whose meta table lacks this record.
    pub fn missing(&self, why: &str) -> RecordError {
        RecordError {
            table: "meta",
            key: self.key.into(),
            why: why.into(),
        }
    }
}

/// A key type of a records table, shown in errors the way operators name records.
pub trait KeyText: Key + 'static {
    fn show(key: &Self::SelfType<'_>, f: &mut std::fmt::Formatter) -> std::fmt::Result;
    /// The key as the index `Record::decode_body_at` takes: only a u64 key is one.
    fn index(_key: &Self::SelfType<'_>) -> Option<u64> {
        None
    }
    /// The key that is the index `index` (`None` unless the key is a u64).
    fn at_index(_index: u64) -> Option<Self::SelfType<'static>> {
        None
    }
}

impl KeyText for u64 {
    fn show(key: &u64, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{key}")
    }
    fn index(key: &u64) -> Option<u64> {
        Some(*key)
    }
    fn at_index(index: u64) -> Option<u64> {
        Some(index)
    }
}

impl KeyText for &'static str {
    fn show(key: &&str, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(key)
    }
}

impl KeyText for (u64, u64, u64) {
    fn show(key: &(u64, u64, u64), f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{key:?}")
    }
}

impl KeyText for (&'static str, u64) {
    fn show(key: &(&str, u64), f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}#{}", key.0, key.1)
    }
}

struct Shown<'a, 'b, K: KeyText>(&'a K::SelfType<'b>);

impl<K: KeyText> std::fmt::Display for Shown<'_, '_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        K::show(self.0, f)
    }
}

/// A struct of the leading fields of record `R`, decodable from `R`'s bytes alone.
pub trait HeadOf<R>: DeserializeOwned {}
impl HeadOf<EffectRecord> for EffectHead {}
impl HeadOf<AuditRecord> for AuditHead {}

/// Audit entries per outcome code, since creation.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub by_outcome: [u64; 8],
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub schema_version: u32,
    pub created_at_ms: u64,
    /// First effect offset still in the window (the eviction cursor).
    pub window_start: u64,
    pub next_effect: u64,
    pub next_audit: u64,
    pub next_quarantine: u64,
    pub next_source: u64,
    /// Hash of the last audit entry (all zeros before the first).
    pub chain_head: [u8; 32],
    /// Index and hash of the last audit entry removed by retention; verification starts there.
    pub audit_anchor: Option<(u64, [u8; 32])>,
    /// redb: no window table holds an entry of an effect below this offset (at most
    /// `window_start`). A window entry that names an effect below `window_start` is not in
    /// the window (it was evicted); the writer deletes those of the effects in
    /// `window_purged..window_start` from the window's tables at its next merge, and moves
    /// this mark to `window_start` there. PostgreSQL deletes an evicted entry at once: equal
    /// to `window_start` there. (Meta record version 2; version 1 had no such entries.)
    pub window_purged: u64,
}

/// `Meta` of record version 1 (before `window_purged`).
#[derive(Deserialize)]
struct MetaV1 {
    schema_version: u32,
    created_at_ms: u64,
    window_start: u64,
    next_effect: u64,
    next_audit: u64,
    next_quarantine: u64,
    next_source: u64,
    chain_head: [u8; 32],
    audit_anchor: Option<(u64, [u8; 32])>,
}

impl From<MetaV1> for Meta {
    fn from(m: MetaV1) -> Meta {
        Meta {
            schema_version: m.schema_version,
            created_at_ms: m.created_at_ms,
            // Every evicted entry was deleted (or marked in `WINDOW_GONE`) at eviction.
            window_purged: m.window_start,
            window_start: m.window_start,
            next_effect: m.next_effect,
            next_audit: m.next_audit,
            next_quarantine: m.next_quarantine,
            next_source: m.next_source,
            chain_head: m.chain_head,
            audit_anchor: m.audit_anchor,
        }
    }
}

impl Meta {
    /// The meta record of a new, empty store created at `created_at_ms`.
    pub fn new(created_at_ms: u64) -> Meta {
        Meta {
            schema_version: SCHEMA_VERSION,
            created_at_ms,
            window_start: 0,
            next_effect: 0,
            next_audit: 0,
            next_quarantine: 0,
            next_source: 0,
            chain_head: [0; 32],
            audit_anchor: None,
            window_purged: 0,
        }
    }
}

/// What retention has removed: every effect below `effects_floor` and every quarantine id
/// below `quarantine_floor` is gone by policy (the audit log's own mark is
/// `Meta::audit_anchor`). Absent (all zero) until retention first prunes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionMarks {
    pub effects_floor: u64,
    pub quarantine_floor: u64,
    /// Totals removed so far, per log.
    pub audit_pruned: u64,
    pub effects_pruned: u64,
    pub quarantine_pruned: u64,
    pub last_pruned_at_ms: u64,
}

/// Which log a relay sink delivers: part of its durable identity (`SinkRecord::stream`), so
/// its cursor, parked events and ledger count positions of that log only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Stream {
    /// The effect log: each applied effect (positions are effect offsets).
    #[default]
    Effects,
    /// The audit log: each audit entry, every decision and action (positions are audit
    /// indexes).
    Audit,
}

impl Stream {
    /// Its stored code (never renumbered).
    pub fn code(self) -> u8 {
        match self {
            Stream::Effects => 0,
            Stream::Audit => 1,
        }
    }

    /// The stream of a stored code; an unknown code reads as what it cannot be mistaken
    /// for by a deliverer of either stream (`None`).
    pub fn from_code(code: u8) -> Option<Stream> {
        match code {
            0 => Some(Stream::Effects),
            1 => Some(Stream::Audit),
            _ => None,
        }
    }

    /// As configured (`stream = "..."`) and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Effects => "effects",
            Stream::Audit => "audit",
        }
    }

    /// What one position of the log is called, in messages.
    pub fn position(self) -> &'static str {
        match self {
            Stream::Effects => "offset",
            Stream::Audit => "audit index",
        }
    }

    /// What the log's entries are called, in messages.
    pub fn entries(self) -> &'static str {
        match self {
            Stream::Effects => "effects",
            Stream::Audit => "audit entries",
        }
    }
}

/// A relay sink's cursor and counters. Record version 4 (version 3 had no `offered_to` and
/// `resent`, version 2 no `stream` either, version 1 no `ledger_len` either).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SinkRecord {
    /// `mqtt`, `http`, `postgres` or `exec`, as configured when the cursor was made.
    pub kind: String,
    /// The first position (effect offset, or audit index for an audit sink) neither
    /// delivered, parked nor passed over.
    pub next: u64,
    /// Bumped by every operator move of the cursor (`relay rewind`, `relay skip`); a running
    /// sink's cursor write carrying an older generation is refused, so it reloads instead of
    /// overwriting.
    pub generation: u64,
    pub registered_at_ms: u64,
    /// When `next` last moved.
    pub advanced_at_ms: u64,
    pub delivered: u64,
    pub parked: u64,
    /// The last failed attempt: when, and what the receiver or the connection said.
    pub last_error: Option<(u64, String)>,
    /// How many entries the sink's ledger (`SINK_LEDGER`) holds, numbered from 0: `verify`
    /// finds a ledger cut short or added to by hand. 0 only in a cursor written before the
    /// ledger existed (record version 1), until its first write by this version.
    pub ledger_len: u64,
    /// `Stream::code` of the log the sink delivers, fixed when the cursor was made (0, the
    /// effect log, in a record of version 1 or 2).
    pub stream: u8,
    /// Where what the sink may have offered to its receiver ends: the deliverer raises it
    /// (durably) before it offers anything at or past it, so every position from `next` up
    /// to here may already be at the receiver, and offering it again is a re-send (`next`
    /// in a record of version 3 or older).
    pub offered_to: u64,
    /// Events offered to the receiver again (after a failed attempt, a restart or a kill
    /// -9, a rewind): the receiver may hold each of them twice, under the same id. An upper
    /// bound: an event counts when it may have reached the receiver before. 0 in a record of
    /// version 3 or older.
    pub resent: u64,
}

impl SinkRecord {
    /// The log the sink delivers (`None`: a code this build does not know).
    pub fn stream(&self) -> Option<Stream> {
        Stream::from_code(self.stream)
    }
}

/// `SinkRecord` as record version 3 wrote it.
#[derive(Serialize, Deserialize)]
struct SinkRecordV3 {
    kind: String,
    next: u64,
    generation: u64,
    registered_at_ms: u64,
    advanced_at_ms: u64,
    delivered: u64,
    parked: u64,
    last_error: Option<(u64, String)>,
    ledger_len: u64,
    stream: u8,
}

/// `SinkRecord` as record version 2 wrote it.
#[derive(Serialize, Deserialize)]
struct SinkRecordV2 {
    kind: String,
    next: u64,
    generation: u64,
    registered_at_ms: u64,
    advanced_at_ms: u64,
    delivered: u64,
    parked: u64,
    last_error: Option<(u64, String)>,
    ledger_len: u64,
}

/// `SinkRecord` as record version 1 wrote it.
#[derive(Deserialize)]
struct SinkRecordV1 {
    kind: String,
    next: u64,
    generation: u64,
    registered_at_ms: u64,
    advanced_at_ms: u64,
    delivered: u64,
    parked: u64,
    last_error: Option<(u64, String)>,
}

impl Record for SinkRecord {
    const VERSION: u8 = RECORD_V4;
    fn decode_older(version: u8, body: &[u8]) -> Option<Result<Self, postcard::Error>> {
        match version {
            RECORD_V3 => Some(
                postcard::from_bytes::<SinkRecordV3>(body).map(|v| SinkRecord {
                    kind: v.kind,
                    next: v.next,
                    generation: v.generation,
                    registered_at_ms: v.registered_at_ms,
                    advanced_at_ms: v.advanced_at_ms,
                    delivered: v.delivered,
                    parked: v.parked,
                    last_error: v.last_error,
                    ledger_len: v.ledger_len,
                    stream: v.stream,
                    offered_to: v.next,
                    resent: 0,
                }),
            ),
            RECORD_V1 => Some(
                postcard::from_bytes::<SinkRecordV1>(body).map(|v| SinkRecord {
                    kind: v.kind,
                    next: v.next,
                    generation: v.generation,
                    registered_at_ms: v.registered_at_ms,
                    advanced_at_ms: v.advanced_at_ms,
                    delivered: v.delivered,
                    parked: v.parked,
                    last_error: v.last_error,
                    ledger_len: 0,
                    stream: Stream::Effects.code(),
                    offered_to: v.next,
                    resent: 0,
                }),
            ),
            2 => Some(
                postcard::from_bytes::<SinkRecordV2>(body).map(|v| SinkRecord {
                    kind: v.kind,
                    next: v.next,
                    generation: v.generation,
                    registered_at_ms: v.registered_at_ms,
                    advanced_at_ms: v.advanced_at_ms,
                    delivered: v.delivered,
                    parked: v.parked,
                    last_error: v.last_error,
                    ledger_len: v.ledger_len,
                    stream: Stream::Effects.code(),
                    offered_to: v.next,
                    resent: 0,
                }),
            ),
            _ => None,
        }
    }
}

/// What a ledger entry records about the offsets `from..to` of a sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerKind {
    /// Entry 0: the sink's cursor was made at `from` (= `to`); nothing below is its concern.
    Start,
    /// Entry 0 of a cursor made before ledgers existed: accounted from `from` (= `to`) on.
    Legacy,
    /// Delivered (acknowledged by the receiver), in `generation`.
    Delivered,
    /// One event the receiver refused for good: it has a parked record.
    Parked,
    /// One parked event delivered after `relay retry`.
    Retried,
    /// Passed over by `relay skip` (audit entry `audit_index`).
    Skipped,
    /// Passed over because the sink's own store already holds them: its cursor, committed
    /// with its rows, was adopted (audit entry `audit_index`).
    Adopted,
    /// One parked event an operator decided not to deliver (`relay discard`, audit entry
    /// `audit_index`).
    Discarded,
    /// Audit entries an audit sink passed over because their outcome is not among its
    /// `outcomes`.
    NotSelected,
}

impl LedgerKind {
    pub const ALL: [LedgerKind; 9] = [
        LedgerKind::Start,
        LedgerKind::Legacy,
        LedgerKind::Delivered,
        LedgerKind::Parked,
        LedgerKind::Retried,
        LedgerKind::Skipped,
        LedgerKind::Adopted,
        LedgerKind::Discarded,
        LedgerKind::NotSelected,
    ];

    /// Its stored code (never renumbered).
    pub fn code(self) -> u8 {
        match self {
            LedgerKind::Start => 0,
            LedgerKind::Legacy => 1,
            LedgerKind::Delivered => 2,
            LedgerKind::Parked => 3,
            LedgerKind::Retried => 4,
            LedgerKind::Skipped => 5,
            LedgerKind::Adopted => 6,
            LedgerKind::Discarded => 7,
            LedgerKind::NotSelected => 8,
        }
    }

    pub fn from_code(code: u8) -> Option<LedgerKind> {
        LedgerKind::ALL.into_iter().find(|k| k.code() == code)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LedgerKind::Start => "start",
            LedgerKind::Legacy => "legacy",
            LedgerKind::Delivered => "delivered",
            LedgerKind::Parked => "parked",
            LedgerKind::Retried => "retried",
            LedgerKind::Skipped => "skipped",
            LedgerKind::Adopted => "adopted",
            LedgerKind::Discarded => "discarded",
            LedgerKind::NotSelected => "not_selected",
        }
    }
}

/// One entry of a sink's ledger: the offsets `from..to` and how they came below its cursor.
/// The entries after entry 0 partition the offsets from entry 0's `from` up to the cursor,
/// in order; consecutive deliveries in one generation extend one entry.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LedgerRecord {
    /// `LedgerKind::code`.
    pub kind: u8,
    pub from: u64,
    pub to: u64,
    /// The cursor's generation when it was written.
    pub generation: u64,
    pub first_at_ms: u64,
    pub last_at_ms: u64,
    /// The audit entry of the action that passed over these offsets (skip, adoption).
    pub audit_index: Option<u64>,
}

impl Record for LedgerRecord {}

/// The store's identity: a random id, drawn when the store is made (or, for a store made
/// before ids existed, at its first open by a writer), and drawn again when a copy of it
/// (`backup`, `migrate --from`) is first opened by a writer, because from then on the copy's
/// offsets are another history than the original's.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StoreIdentity {
    pub id: [u8; 16],
    /// Set by `backup` and `migrate --from` in the copy they make; its first writer draws a
    /// new id and moves this to `derived_from`.
    pub copy: Option<CopyMark>,
    /// The copy this store was made from, once it became a live store.
    pub derived_from: Option<CopyMark>,
}

impl Record for StoreIdentity {}

/// Which store a copy was made of, how and when.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CopyMark {
    /// The id of the store copied.
    pub of: [u8; 16],
    /// `backup` or `migrate`.
    pub how: String,
    pub made_at_ms: u64,
    /// The copied store's next effect offset: the copy holds the offsets below.
    pub next_effect: u64,
}

/// An event a sink's receiver refused for good, kept with what it said (`relay parked`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ParkedRecord {
    pub parked_at_ms: u64,
    /// The event id (the CloudEvents `id`).
    pub id: String,
    pub key: [u8; 32],
    pub agency: String,
    pub source_id: String,
    /// The topic the message arrived on (the mqtt sink's `{topic}`).
    pub topic: String,
    pub reason: String,
    /// The receiver's last response (status line and the start of the body, or the
    /// program's exit status and stderr).
    pub response: String,
    pub attempts: u64,
    /// `on_poison = "block"`: the sink's cursor waits at this event.
    pub blocking: bool,
    /// Set by `relay retry`: the sink delivers it again and drops the record once accepted.
    pub retry_requested_at_ms: Option<u64>,
    /// The event exactly as it was offered, so a retry needs no effect record (retention may
    /// have pruned it since).
    pub event: String,
}

/// What the store knows of messages lost upstream of it (a broker dropping queued messages,
/// a broker session lost), written in the transaction of the batch that revealed a gap
/// (`engine::Writer`) or by `run` at the connect that found its session gone
/// (`store::upstream::note_connect`, which also notes every connect). Bounded whatever the
/// history: totals since creation, per-minute counts of the last hour (`health`), the last
/// few events of each kind and the last connects (the after-action report's broker
/// switches), and the client ids `run` consumed under.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamLosses {
    /// Gap events reported since the store was created.
    pub gap_events: u64,
    /// Sequences missing in those gaps when each was reported (a late arrival filling one
    /// later is `applied_late` and lowers nothing).
    pub missing_sequences: u64,
    /// Broker sessions found lost at a (re)connect.
    pub sessions_lost: u64,
    /// One entry per minute with a loss, oldest first, none older than an hour when written
    /// (at most `upstream::MINUTES`).
    pub minutes: Vec<LossMinute>,
    /// The newest gap events, oldest first (at most `upstream::RECENT`).
    pub recent_gaps: Vec<GapEvent>,
    /// The newest session losses, oldest first (at most `upstream::RECENT`).
    pub recent_sessions_lost: Vec<SessionLoss>,
    /// The MQTT client ids `run` committed deliveries under, oldest first (at most
    /// `upstream::CONSUMERS`): a CONNACK without a session for one of them is a lost session.
    pub consumers: Vec<Consumer>,
    /// The newest (re)connects of `run` to a broker, oldest first (at most
    /// `upstream::CONNECTS`): the broker switches an after-action review draws.
    pub recent_connects: Vec<ConnectEvent>,
}

/// `run` connected to `broker` as `client_id`; whether the broker kept its session.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ConnectEvent {
    pub at_ms: u64,
    pub broker: String,
    pub client_id: String,
    pub session_present: bool,
}

/// The losses reported in one minute.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossMinute {
    /// Unix time in minutes (ms / 60 000).
    pub minute: u64,
    pub gap_events: u64,
    pub missing_sequences: u64,
    pub sessions_lost: u64,
}

/// One gap: sequences `from..=to` of a source's epoch had not arrived when a later one was
/// applied.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GapEvent {
    pub at_ms: u64,
    pub agency: String,
    pub source_id: String,
    pub epoch: u64,
    pub from: u64,
    pub to: u64,
}

/// A broker answered a (re)connect under a client id the store had consumed under without
/// its session: whatever it queued for that session is gone.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SessionLoss {
    pub at_ms: u64,
    pub broker: String,
    pub client_id: String,
}

/// A client id `run` committed deliveries under: first when, from which broker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    pub client_id: String,
    pub broker: String,
    pub since_ms: u64,
}

impl Record for UpstreamLosses {}
impl Record for IndexMerge {}
impl Record for Counters {}
/// Version 1 is the serde form without `window_purged`.
impl Record for Meta {
    const VERSION: u8 = RECORD_V2;
    fn decode_older(version: u8, body: &[u8]) -> Option<Result<Self, postcard::Error>> {
        (version == RECORD_V1).then(|| postcard::from_bytes::<MetaV1>(body).map(Meta::from))
    }
}
impl Record for RetentionMarks {}
impl Record for ParkedRecord {}
impl Record for BurstRecord {}
impl Record for SourceRecord {}
/// Version 1 is `WindowRecord`'s serde form (the digest always stored); version 2 the serde
/// form of `WindowEntry`.
impl Record for WindowEntry {
    const VERSION: u8 = RECORD_V2;
    fn decode_older(version: u8, body: &[u8]) -> Option<Result<Self, postcard::Error>> {
        (version == RECORD_V1).then(|| {
            postcard::from_bytes::<WindowRecord>(body).map(|w| WindowEntry {
                effect_offset: w.effect_offset,
                digest: Some(w.digest),
            })
        })
    }
}
/// Version 1 is the serde form of the struct (without `digest`); version 2 the stored form
/// (`stored`) without the digest, version 3 with it, version 4 with it or, when it is its
/// payload's, a tag in its place (`stored::encode_effect`).
impl Record for EffectRecord {
    const VERSION: u8 = RECORD_V4;
    fn decode_older(version: u8, body: &[u8]) -> Option<Result<Self, postcard::Error>> {
        match version {
            RECORD_V1 => Some(postcard::from_bytes(body)),
            RECORD_V2 => Some(super::stored::decode_effect_v2(body)),
            RECORD_V3 => Some(super::stored::decode_effect_v3(body)),
            _ => None,
        }
    }
    fn encode_body(&self, out: Vec<u8>) -> Result<Vec<u8>, postcard::Error> {
        super::stored::encode_effect(self, out)
    }
    fn decode_body(body: &[u8]) -> Result<Self, postcard::Error> {
        super::stored::decode_effect(body)
    }
}
/// Version 1 is the serde form of the struct; version 2 `stored::encode_audit`'s with the
/// hash stored; version 3 with the hash left out when it is the one its index, content and
/// `prev_hash` give (`stored::note_chained`), recomputed when decoded; version 4 also with
/// `prev_hash` left out when it is the hash of the entry stored before it.
impl Record for AuditRecord {
    const VERSION: u8 = RECORD_V4;
    fn decode_older(version: u8, body: &[u8]) -> Option<Result<Self, postcard::Error>> {
        Self::decode_older_at(version, body, None)
    }
    fn decode_older_at(
        version: u8,
        body: &[u8],
        index: Option<u64>,
    ) -> Option<Result<Self, postcard::Error>> {
        match version {
            RECORD_V1 => Some(postcard::from_bytes(body)),
            RECORD_V2 => Some(super::stored::decode_audit_v2(body)),
            RECORD_V3 => Some(super::stored::decode_audit_v3(body, index)),
            _ => None,
        }
    }
    fn encode_body(&self, out: Vec<u8>) -> Result<Vec<u8>, postcard::Error> {
        super::stored::encode_audit(self, out)
    }
    fn decode_body(body: &[u8]) -> Result<Self, postcard::Error> {
        super::stored::decode_audit(body, None, None)?.ok_or(postcard::Error::SerdeDeCustom)
    }
    fn decode_body_at(
        body: &[u8],
        index: Option<u64>,
        prev: Option<&[u8; 32]>,
    ) -> Result<Option<Self>, postcard::Error> {
        super::stored::decode_audit(body, index, prev)
    }
    fn chain_hash(&self) -> Option<[u8; 32]> {
        Some(self.hash)
    }
}
impl Record for QuarantineRecord {}

/// One replay burst: duplicates absorbed after `run` (re)connected to `broker`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BurstRecord {
    pub broker: String,
    pub connected_at_ms: u64,
    pub ended_at_ms: u64,
    pub duplicates: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    pub agency: String,
    pub source_id: String,
    /// (epoch, sequence)
    pub high_water: (u64, u64),
    pub evicted_floor: Option<(u64, u64)>,
}

/// A window entry with its content digest: what a lookup compares a delivery with. Stored as
/// a `WindowEntry`; record version 1 of the window was this struct's serde form.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRecord {
    pub digest: [u8; 32],
    pub effect_offset: u64,
}

/// A window entry as stored (record version 2): the offset of the effect that holds the
/// position and, only when that effect record does not hold it, the content digest. The
/// engine writes a position's effect (record version 3, with the digest) and then its entry
/// in one transaction, so an entry of redb's window leaves the digest to the effect (33 of its
/// 60 bytes, in pages half empty); `resolve` reads it back from there. Retention never
/// removes an effect the window names (`Meta::window_start`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowEntry {
    pub effect_offset: u64,
    pub digest: Option<[u8; 32]>,
}

impl WindowEntry {
    /// The entry with its digest: its own, else the one `effect_digest` reads from the effect
    /// record at its offset (`None` if that record is missing or holds none: the file is
    /// damaged, and the position's duplicates cannot be told from conflicts).
    pub fn resolve(
        self,
        key: (u64, u64, u64),
        effect_digest: impl FnOnce(u64) -> Result<Option<[u8; 32]>, StoreError>,
    ) -> Result<WindowRecord, StoreError> {
        let digest = match self.digest {
            Some(d) => d,
            None => effect_digest(self.effect_offset)?.ok_or_else(|| {
                StoreError::from(RecordError {
                    table: WINDOW.name(),
                    key: Shown::<(u64, u64, u64)>(&key).to_string(),
                    why: format!(
                        "the window entry leaves its digest to effect {}, which holds none \
                         (missing, written before record version 3, or its payload, which \
                         gives its digest, no longer parses)",
                        self.effect_offset
                    ),
                })
            })?,
        };
        Ok(WindowRecord {
            digest,
            effect_offset: self.effect_offset,
        })
    }
}

/// The leading fields of `EffectRecord`; eviction decodes only these.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectHead {
    pub source_no: u64,
    pub epoch: u64,
    pub sequence: u64,
    pub received_at_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct EffectRecord {
    // Must start with exactly the fields of `EffectHead`, in its order (and so must the stored
    // form of every version: `stored::Effect`).
    pub source_no: u64,
    pub epoch: u64,
    pub sequence: u64,
    pub received_at_ms: u64,
    pub key: [u8; 32],
    pub agency: String,
    pub source_id: String,
    pub topic: String,
    pub late: bool,
    pub released: bool,
    pub audit_index: u64,
    /// The payload exactly as delivered (valid UTF-8 JSON).
    #[serde(with = "bytes")]
    pub payload: Vec<u8>,
    /// The content digest the window compares deliveries of this position with (record
    /// version 3 on; `None` in an older record, whose window entry holds it). Not part of
    /// version 1's serde form.
    #[serde(skip)]
    pub digest: Option<[u8; 32]>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditRecord {
    // Must start with exactly the fields of `AuditHead`, in its order (and so must the stored
    // form of every version: `stored::Audit`).
    pub recorded_at_ms: u64,
    pub outcome: u8,
    pub key: Option<[u8; 32]>,
    pub agency: Option<String>,
    pub source_id: Option<String>,
    pub epoch: Option<u64>,
    pub sequence: Option<u64>,
    pub topic: String,
    pub reason: String,
    pub digest: Option<[u8; 32]>,
    pub effect_offset: Option<u64>,
    pub quarantine_id: Option<u64>,
    pub prev_hash: [u8; 32],
    pub hash: [u8; 32],
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct QuarantineRecord {
    pub outcome: u8,
    pub reason: String,
    pub topic: String,
    pub received_at_ms: u64,
    pub last_seen_ms: u64,
    /// How many deliveries of these bytes were quarantined here (1 + replays).
    pub deliveries: u64,
    pub key: Option<[u8; 32]>,
    pub audit_index: u64,
    #[serde(with = "bytes")]
    pub payload: Vec<u8>,
}

/// Byte strings as one length-prefixed blob instead of a sequence of `u8` (same postcard bytes,
/// much less work per byte).
pub(super) mod bytes {
    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde::ser::Serializer;

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut v = Vec::new();
                while let Some(b) = seq.next_element()? {
                    v.push(b);
                }
                Ok(v)
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

/// A record that failed to decode: names the table and key so an operator can find it.
#[derive(Debug, thiserror::Error)]
#[error("record {table}#{key} cannot be decoded: {why}")]
pub struct RecordError {
    pub table: &'static str,
    pub key: String,
    pub why: String,
}

fn encode<T: Record>(record: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(record, &mut out);
    out
}

/// Encodes into `buf` (cleared first), reusing its allocation on the commit path.
fn encode_into<'b, T: Record>(record: &T, buf: &'b mut Vec<u8>) -> &'b [u8] {
    buf.clear();
    buf.push(T::VERSION);
    let taken = std::mem::take(buf);
    // postcard only fails on unsupported serde features (none used) or a full fixed buffer.
    *buf = match record.encode_body(taken) {
        Ok(v) => v,
        Err(e) => unreachable!("postcard cannot encode a record: {e}"),
    };
    buf.as_slice()
}

fn decode<T: Record>(
    table: &'static str,
    key: impl std::fmt::Display,
    index: Option<u64>,
    bytes: &[u8],
) -> Result<T, RecordError> {
    match decode_after(table, &key, index, None, bytes)? {
        Some(r) => Ok(r),
        None => Err(RecordError {
            table,
            key: key.to_string(),
            why: format!("{CHAINED_ALONE} read alone"),
        }),
    }
}

/// Why a chained record did not decode: it leaves its `prev_hash` to the record before it.
const CHAINED_ALONE: &str = "leaves its prev_hash to the entry before it, which was not";

/// `decode`, given the `chain_hash` of the record stored at `index - 1` (`prev`) if the
/// caller has it: `Ok(None)` for a record that needs it and was not given it.
fn decode_after<T: Record>(
    table: &'static str,
    key: &impl std::fmt::Display,
    index: Option<u64>,
    prev: Option<&[u8; 32]>,
    bytes: &[u8],
) -> Result<Option<T>, RecordError> {
    let err = |why: String| RecordError {
        table,
        key: key.to_string(),
        why,
    };
    match bytes.split_first() {
        Some((&v, rest)) if v == T::VERSION => {
            T::decode_body_at(rest, index, prev).map_err(|e| err(format!("postcard: {e}")))
        }
        Some((&v, rest)) => match T::decode_older_at(v, rest, index) {
            Some(r) => r
                .map(Some)
                .map_err(|e| err(format!("postcard (record version {v}): {e}"))),
            None => Err(err(format!("unknown record version {v}"))),
        },
        None => Err(err("empty record".into())),
    }
}

/// The leading fields of `AuditRecord`; retention and `stats` decode only these.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditHead {
    // Must be exactly the first fields of `AuditRecord`, in its order.
    pub recorded_at_ms: u64,
    pub outcome: u8,
}

/// Decodes only the leading fields `H` of a stored record (a prefix struct of its record, in
/// every version of it up to `version`).
fn decode_head<'a, H: Deserialize<'a>>(
    table: &'static str,
    key: u64,
    bytes: &'a [u8],
    version: u8,
) -> Result<H, RecordError> {
    let err = |why: String| RecordError {
        table,
        key: key.to_string(),
        why,
    };
    match bytes.split_first() {
        Some((&v, rest)) if (RECORD_V1..=version).contains(&v) => {
            postcard::take_from_bytes::<H>(rest)
                .map(|(h, _)| h)
                .map_err(|e| err(format!("postcard: {e}")))
        }
        Some((v, _)) => Err(err(format!("unknown record version {v}"))),
        None => Err(err("empty record".into())),
    }
}

/// The fuzz check of every table's record decoder (`fuzz/` target `records` and its
/// regression inputs): arbitrary bytes decode to a record or a `RecordError`, never a panic;
/// a decoded record re-encodes to bytes that decode to the same record; a head decodes from
/// any record it is a prefix of, with the same fields.
#[doc(hidden)]
pub fn check_decoders(bytes: &[u8]) {
    fn round_trip<T: Record + PartialEq + std::fmt::Debug>(
        table: &'static str,
        bytes: &[u8],
    ) -> Option<T> {
        let record = decode::<T>(table, 0, Some(0), bytes).ok()?;
        let again = decode::<T>(table, 0, Some(0), &encode(&record));
        assert!(
            again.as_ref().is_ok_and(|r| *r == record),
            "{table}: {record:?} does not survive re-encoding: {again:?}"
        );
        Some(record)
    }
    fn records<K: KeyText, T: Record + PartialEq + std::fmt::Debug>(
        table: Records<K, T>,
        bytes: &[u8],
    ) -> Option<T> {
        round_trip(table.name(), bytes)
    }
    fn meta<T: Record + PartialEq + std::fmt::Debug>(_: MetaEntry<T>, bytes: &[u8]) -> Option<T> {
        round_trip("meta", bytes)
    }
    meta(META, bytes);
    meta(RETENTION, bytes);
    meta(COUNTS, bytes);
    meta(IDENTITY, bytes);
    meta(UPSTREAM, bytes);
    records(REPLAY_BURSTS, bytes);
    records(SOURCES, bytes);
    records(WINDOW, bytes);
    records(WINDOW_RECENT, bytes);
    records(QUARANTINE, bytes);
    records(SINK_CURSORS, bytes);
    records(SINK_PARKED, bytes);
    records(SINK_LEDGER, bytes);
    let effect_head = EFFECTS.head::<EffectHead>(0, bytes);
    if let Some(e) = records(EFFECTS, bytes) {
        let h = effect_head.as_ref().ok();
        assert_eq!(
            h.map(|h| (h.source_no, h.epoch, h.sequence, h.received_at_ms)),
            Some((e.source_no, e.epoch, e.sequence, e.received_at_ms)),
            "EffectHead disagrees with the EffectRecord it prefixes"
        );
    }
    let audit_head = AUDIT.head::<AuditHead>(0, bytes);
    if let Some(a) = records(AUDIT, bytes) {
        assert_eq!(
            audit_head.ok().map(|h| (h.recorded_at_ms, h.outcome)),
            Some((a.recorded_at_ms, a.outcome)),
            "AuditHead disagrees with the AuditRecord it prefixes"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_removes_the_key_index_blocks_that_lie_wholly_inside_its_range() {
        let b = AUDIT_KEY_BLOCK;
        assert_eq!(whole_blocks(&(0..=b - 1)), 0..1);
        assert!(whole_blocks(&(0..=b - 2)).is_empty());
        assert_eq!(whole_blocks(&(5..=2 * b - 1)), 1..2);
        assert_eq!(whole_blocks(&(b..=3 * b - 1)), 1..3);
        assert_eq!(whole_blocks(&(b + 1..=3 * b - 2)), 2..2);
        assert!(whole_blocks(&(10..=20)).is_empty());
        assert!(whole_blocks(&(3 * b..=3 * b)).is_empty());
        assert_eq!(whole_blocks(&(0..=u64::MAX)).start, 0);
    }

    #[test]
    fn a_key_index_bucket_is_the_block_then_the_keys_first_four_bytes() {
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        key[4] = 0xff; // not part of the bucket
        assert_eq!(audit_key_bucket(0, &key), 0xdead_beef);
        assert_eq!(
            audit_key_bucket(AUDIT_KEY_BLOCK * 7 + 5, &key),
            7 << 32 | 0xdead_beef
        );
        assert_eq!(
            audit_key_bucket(AUDIT_KEY_BLOCK - 1, &key),
            audit_key_bucket(0, &key)
        );
    }

    #[test]
    fn a_source_index_bucket_is_the_block_then_the_source_number() {
        let b = AUDIT_KEY_BLOCK;
        assert_eq!(audit_source_bucket(0, Some(7)), 7);
        assert_eq!(audit_source_bucket(b * 3 + 1, Some(7)), 3 << 32 | 7);
        assert_eq!(
            audit_source_bucket(b * 3 + 1, Some(u64::from(u32::MAX))),
            3 << 32 | u64::from(u32::MAX)
        );
        // No number, or one that does not fit its half: the block's unnumbered bucket.
        assert_eq!(audit_source_bucket(5, None), UNNUMBERED);
        assert_eq!(audit_source_bucket(b * 3 + 1, None), UNNUMBERED | 3);
        assert_eq!(audit_source_bucket(b * 3, Some(1 << 32)), UNNUMBERED | 3);
        // Both kinds of a block lie in its two ranges, and no other block's do.
        for (index, no) in [(b * 3, Some(7)), (b * 4 - 1, None), (b * 3 + 9, Some(0))] {
            let bucket = audit_source_bucket(index, no);
            let [numbered, unnumbered] = audit_source_ranges(&(3..4));
            assert!(numbered.contains(&bucket) || unnumbered.contains(&bucket));
            let [n2, u2] = audit_source_ranges(&(4..6));
            assert!(!n2.contains(&bucket) && !u2.contains(&bucket));
        }
        // Unnumbered buckets keep their order as PostgreSQL bigints.
        assert!(((UNNUMBERED | 3) as i64) < ((UNNUMBERED | 4) as i64));
    }

    #[test]
    fn effect_head_is_a_prefix_of_the_effect_record() {
        let r = EffectRecord {
            source_no: 7,
            epoch: 2,
            sequence: 300,
            received_at_ms: 1_700_000_000_000,
            key: [1; 32],
            agency: "A".into(),
            source_id: "S".into(),
            topic: "t".into(),
            late: false,
            released: false,
            audit_index: 5,
            payload: b"{}".to_vec(),
            digest: Some([4; 32]),
        };
        let bytes = encode(&r);
        // Same bytes as serde's default sequence-of-u8 encoding: length, then raw bytes.
        assert!(bytes.ends_with(&[2, b'{', b'}']));
        let h: EffectHead = EFFECTS.head(0, &bytes).unwrap();
        assert_eq!(
            (h.source_no, h.epoch, h.sequence, h.received_at_ms),
            (7, 2, 300, 1_700_000_000_000)
        );
        assert_eq!(EFFECTS.decode(&0, &bytes).unwrap(), r);
    }

    #[test]
    fn audit_head_is_a_prefix_of_the_audit_record() {
        let r = AuditRecord {
            recorded_at_ms: 1_700_000_000_123,
            outcome: 2,
            key: Some([3; 32]),
            agency: Some("A".into()),
            source_id: Some("S".into()),
            epoch: Some(1),
            sequence: Some(9),
            topic: "t".into(),
            reason: "r".into(),
            digest: None,
            effect_offset: Some(4),
            quarantine_id: None,
            prev_hash: [0; 32],
            hash: [1; 32],
        };
        let h: AuditHead = AUDIT.head(0, &AUDIT.encode(&r)).unwrap();
        assert_eq!((h.recorded_at_ms, h.outcome), (1_700_000_000_123, 2));
    }

    /// Entries chained as the writer chains them (each after the one the table holds before
    /// it) read the same alone, in a range from anywhere, and backwards; with an entry gone
    /// (damage), those that leave their `prev_hash` to it are named errors up to the next
    /// checkpoint, and the rest still read.
    #[test]
    fn audit_entries_that_leave_their_prev_hash_out_read_alone_in_ranges_and_backwards() {
        use super::super::stored::{AUDIT_CHECKPOINT, note_chained};
        use redb::ReadableDatabase as _;
        let db = redb::Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .unwrap();
        let n = 3 * AUDIT_CHECKPOINT + 5;
        let mut written = Vec::new();
        let txn = db.begin_write().unwrap();
        {
            let mut t = AUDIT.open_mut(&txn).unwrap();
            let mut buf = Vec::new();
            let mut prev = [0; 32];
            for i in 0..n {
                let mut r = AuditRecord {
                    recorded_at_ms: 1_700_000_000_000 + i,
                    outcome: 1,
                    key: None,
                    agency: None,
                    source_id: None,
                    epoch: None,
                    sequence: Some(i),
                    topic: "t".into(),
                    reason: format!("entry {i}"),
                    digest: None,
                    effect_offset: None,
                    quarantine_id: None,
                    prev_hash: prev,
                    hash: [0; 32],
                };
                r.hash = crate::store::audit::entry_hash(i, &r, &prev);
                note_chained(i, &r.hash, i > 0);
                t.put(i, &r, &mut buf).unwrap();
                prev = r.hash;
                written.push(r);
            }
        }
        txn.commit().unwrap();
        let txn = db.begin_read().unwrap();
        let t = AUDIT.open(&txn).unwrap();
        for i in 0..n {
            assert_eq!(
                t.get(i).unwrap().as_ref(),
                Some(&written[i as usize]),
                "{i}"
            );
        }
        // Reading them one at a time remembering the hashes computed, in any order.
        let chain = ChainHashes::default();
        for i in (0..n).rev().chain((0..n).step_by(3)).chain(0..n) {
            let read = t.get_remembering(i, &chain).unwrap();
            assert_eq!(read.as_ref(), Some(&written[i as usize]), "{i}");
        }
        for from in [0, 1, AUDIT_CHECKPOINT - 1, AUDIT_CHECKPOINT + 7] {
            let read: Vec<AuditRecord> = t.range(from..).unwrap().map(|e| e.unwrap().1).collect();
            assert_eq!(read, written[from as usize..], "from {from}");
        }
        let back: Vec<AuditRecord> = t.all().unwrap().rev().map(|e| e.unwrap().1).collect();
        assert!(back.iter().eq(written.iter().rev()));
        drop((t, txn));

        let gone = AUDIT_CHECKPOINT + 3;
        let txn = db.begin_write().unwrap();
        AUDIT.open_mut(&txn).unwrap().remove(gone).unwrap();
        txn.commit().unwrap();
        let txn = db.begin_read().unwrap();
        let t = AUDIT.open(&txn).unwrap();
        for i in (0..n).filter(|&i| i != gone) {
            let read = t.get(i);
            if i > gone && i < 2 * AUDIT_CHECKPOINT {
                let e = read.unwrap_err().to_string();
                let want =
                    format!("entry {gone}, whose hash it takes as its prev_hash, is missing");
                assert!(e.contains(&want), "{i}: {e}");
            } else {
                assert_eq!(read.unwrap().as_ref(), Some(&written[i as usize]), "{i}");
            }
        }
        let read: Vec<_> = t.range(gone + 1..).unwrap().collect();
        let failed = read.iter().filter(|e| e.is_err()).count() as u64;
        assert_eq!(failed, 2 * AUDIT_CHECKPOINT - gone - 1);
        assert!(read.last().unwrap().is_ok());
        drop(read);
        drop((t, txn));

        // Entry 0 leaving its prev_hash out (no build writes it) is damage, named.
        let txn = db.begin_write().unwrap();
        {
            let r = &written[1];
            note_chained(1, &r.hash, true);
            let bytes = AUDIT.encode(r);
            let mut t = AUDIT.open_mut(&txn).unwrap();
            t.table.insert(0, bytes.as_slice()).unwrap();
            let e = t.get(0).unwrap_err().to_string();
            assert!(
                e.contains("leaves its prev_hash to the entry before it"),
                "{e}"
            );
        }
        txn.abort().unwrap();
    }

    #[test]
    fn a_new_store_holds_exactly_the_listed_tables() {
        use redb::TableHandle as _;
        let store = crate::store::Store::open_in_memory(Default::default()).unwrap();
        let snap = store.reader().unwrap();
        let mut held: Vec<String> = snap
            .guard(|txn| -> Result<Vec<String>, StoreError> {
                Ok(txn.list_tables()?.map(|t| t.name().to_string()).collect())
            })
            .unwrap();
        let mut listed = table_names();
        held.sort();
        listed.sort();
        assert_eq!(held, listed, "Store::init and for_each_table disagree");
        assert!(snap.guard(unlisted_tables).unwrap().is_empty());
    }

    #[test]
    fn sink_records_of_versions_2_and_3_decode_and_version_4_keeps_the_offered_mark() {
        let v2 = SinkRecordV2 {
            kind: "exec".into(),
            next: 41,
            generation: 2,
            registered_at_ms: 1_000,
            advanced_at_ms: 2_000,
            delivered: 40,
            parked: 1,
            last_error: Some((3_000, "HTTP 503".into())),
            ledger_len: 4,
        };
        let mut bytes = vec![2];
        bytes.extend(postcard::to_allocvec(&v2).unwrap());
        let r = SINK_CURSORS.decode(&"cop", &bytes).unwrap();
        assert_eq!(
            (r.kind.as_str(), r.next, r.generation, r.delivered, r.parked),
            ("exec", 41, 2, 40, 1)
        );
        assert_eq!((r.ledger_len, r.stream()), (4, Some(Stream::Effects)));
        assert_eq!(r.last_error, Some((3_000, "HTTP 503".into())));
        assert_eq!((r.offered_to, r.resent), (41, 0));
        // Version 3: the stream kept, nothing offered past the cursor, nothing re-sent.
        let v3 = SinkRecordV3 {
            kind: "exec".into(),
            next: 41,
            generation: 2,
            registered_at_ms: 1_000,
            advanced_at_ms: 2_000,
            delivered: 40,
            parked: 1,
            last_error: None,
            ledger_len: 4,
            stream: Stream::Audit.code(),
        };
        let mut bytes = vec![3];
        bytes.extend(postcard::to_allocvec(&v3).unwrap());
        let r3 = SINK_CURSORS.decode(&"cop", &bytes).unwrap();
        assert_eq!(
            (r3.stream(), r3.next, r3.offered_to, r3.resent),
            (Some(Stream::Audit), 41, 41, 0)
        );
        // Written again by this version: version 4, the stream and counts kept.
        let audit = SinkRecord {
            stream: Stream::Audit.code(),
            offered_to: 60,
            resent: 7,
            ..r
        };
        let bytes = SINK_CURSORS.encode(&audit);
        assert_eq!(bytes[0], 4);
        let back = SINK_CURSORS.decode(&"cop", &bytes).unwrap();
        assert_eq!(back, audit);
        assert_eq!(back.stream(), Some(Stream::Audit));
    }

    /// A meta record of version 1 (before `window_purged`) reads with the mark at the
    /// window's start: its evicted entries were all deleted or marked gone at eviction.
    #[test]
    fn a_meta_record_of_version_1_reads_with_nothing_left_to_purge() {
        let m = Meta {
            window_start: 40,
            next_effect: 50,
            audit_anchor: Some((3, [7; 32])),
            ..Meta::new(123)
        };
        let v1 = (
            m.schema_version,
            m.created_at_ms,
            m.window_start,
            m.next_effect,
            m.next_audit,
            m.next_quarantine,
            m.next_source,
            m.chain_head,
            m.audit_anchor,
        );
        let mut bytes = vec![RECORD_V1];
        bytes.extend(postcard::to_allocvec(&v1).unwrap());
        let back = META.decode(&bytes).unwrap();
        assert_eq!(
            back,
            Meta {
                window_purged: 40,
                ..m.clone()
            }
        );
        let now = META.encode(&Meta {
            window_purged: 30,
            ..m.clone()
        });
        assert_eq!(now[0], RECORD_V2);
        assert_eq!(META.decode(&now).unwrap().window_purged, 30);
    }

    #[test]
    fn unknown_versions_are_named_errors() {
        let e = META.decode(&[9, 1, 2]).unwrap_err();
        assert!(e.to_string().contains("unknown record version 9"), "{e}");
    }
}
