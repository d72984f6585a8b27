//! The PostgreSQL schema: its tables, its version, and the statements the store runs on it.
//! Each table holds the same versioned postcard records as the redb file (`tables.rs`), keyed
//! by the same fields, so a copy between the two (`migrate --from`) moves bytes, not meaning.
//! `u64` keys are stored as `bigint` bit for bit (offsets, indices and ids never reach 2^63;
//! epochs and sequences may, and are only ever compared for equality).

/// Version of the PostgreSQL schema (its tables and columns); bump with a migration step in
/// `migrations` and a CHANGELOG line.
pub const PG_SCHEMA_VERSION: i32 = 5;

/// Each migration step: the DDL that takes version `i` to `i + 1` (`{s}` is the schema).
const MIGRATIONS: &[&str] = &[
    // 0 -> 1
    "CREATE TABLE {s}.meta (name text PRIMARY KEY, record bytea NOT NULL);
     CREATE TABLE {s}.source_ids (agency text NOT NULL, source_id text NOT NULL,
         no bigint NOT NULL UNIQUE, PRIMARY KEY (agency, source_id));
     CREATE TABLE {s}.sources (no bigint PRIMARY KEY, record bytea NOT NULL);
     CREATE TABLE {s}.window_entries (source_no bigint NOT NULL, epoch bigint NOT NULL,
         sequence bigint NOT NULL, record bytea NOT NULL,
         PRIMARY KEY (source_no, epoch, sequence));
     CREATE TABLE {s}.effects (effect_offset bigint PRIMARY KEY, record bytea NOT NULL);
     CREATE TABLE {s}.audit (audit_index bigint PRIMARY KEY, record bytea NOT NULL);
     CREATE TABLE {s}.quarantine (id bigint PRIMARY KEY, record bytea NOT NULL);
     CREATE TABLE {s}.quarantine_fp (fp bytea PRIMARY KEY, id bigint NOT NULL);
     CREATE TABLE {s}.quarantine_fp_by_id (id bigint PRIMARY KEY, fp bytea NOT NULL);
     CREATE TABLE {s}.replay_bursts (no bigint PRIMARY KEY, record bytea NOT NULL);
     CREATE TABLE {s}.sink_cursors (name text PRIMARY KEY, record bytea NOT NULL);
     CREATE TABLE {s}.sink_parked (name text NOT NULL, effect_offset bigint NOT NULL,
         record bytea NOT NULL, PRIMARY KEY (name, effect_offset));",
    // 1 -> 2: the sinks' ledgers.
    "CREATE TABLE {s}.sink_ledger (name text NOT NULL, seq bigint NOT NULL,
         record bytea NOT NULL, PRIMARY KEY (name, seq));",
    // 2 -> 3: the audit log's key index (`tables::AUDIT_KEYS`; filled by `store::upgrade`).
    // The log is renamed so that a member of an older build still running against the
    // schema fails its next commit instead of appending entries the index does not name.
    "ALTER TABLE {s}.audit RENAME TO audit_log;
     CREATE TABLE {s}.audit_keys (bucket bigint NOT NULL, audit_index bigint NOT NULL,
         PRIMARY KEY (bucket, audit_index));",
    // 3 -> 4: the audit log's source index (`tables::AUDIT_SOURCES`; filled by
    // `store::upgrade`). Version 3 was never released: no fence against its members.
    "CREATE TABLE {s}.audit_sources (bucket bigint NOT NULL, audit_index bigint NOT NULL,
         epoch bigint NOT NULL, sequence bigint NOT NULL, PRIMARY KEY (bucket, audit_index));",
    // 4 -> 5: both audit indexes by their low 32 bits (a key's first four bytes, a source's
    // number) across every block, so `explain` and `gaps --source` read one index range
    // instead of probing a bucket per block of 4,096 entries (4,883 at 20M entries). The
    // tables and their rows are unchanged: a member of version 4 still writes them right.
    // The second covers its rows (read by the index alone once vacuumed: a source's rows
    // lie on as many heap pages as it has rows) and holds the numbered buckets only
    // (`bucket >= 0`: the unnumbered ones, negative, keep the block in their low bits).
    "CREATE INDEX audit_keys_by_key ON {s}.audit_keys ((bucket & 4294967295), audit_index);
     CREATE INDEX audit_sources_by_source ON {s}.audit_sources ((bucket & 4294967295), audit_index)
         INCLUDE (bucket, epoch, sequence) WHERE bucket >= 0;",
];

/// The deadline of one migration step's DDL, instead of `[store] statement_timeout_ms`: a step
/// that indexes a table already holding rows (4 -> 5) runs as long as the table needs.
pub const MIGRATION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The DDL of step `from` -> `from + 1` in `schema`.
pub fn migration(from: i32, schema: &str) -> Option<String> {
    let step = MIGRATIONS.get(usize::try_from(from).ok()?)?;
    Some(step.replace("{s}", schema))
}

/// Whether `name` is a plain lower-case SQL identifier (no quoting needed, none possible to
/// abuse).
pub fn schema_name_problem(name: &str) -> Option<&'static str> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Some("must be a lower-case SQL name: [a-z_][a-z0-9_]*");
    }
    if name.len() > 63 {
        return Some("is longer than PostgreSQL's 63-byte identifiers");
    }
    if name.starts_with("pg_") {
        return Some("must not start with pg_ (reserved for PostgreSQL's own schemas)");
    }
    None
}

/// Every statement of the store, with the schema filled in once.
pub struct Sql {
    pub lock: String,
    pub meta_all: String,
    pub meta_upsert: String,
    pub prefetch: String,
    pub source_no: String,
    pub source_ids_insert: String,
    pub source: String,
    pub sources_upsert: String,
    pub window: String,
    pub effect: String,
    pub window_upsert: String,
    pub window_delete: String,
    pub window_present: String,
    pub effects_insert: String,
    pub effect_heads: String,
    pub effects_delete_range: String,
    pub audit: String,
    pub audit_insert: String,
    pub audit_range: String,
    pub audit_heads: String,
    pub audit_delete_range: String,
    pub audit_index_delete_blocks: String,
    pub quarantine: String,
    pub quarantine_upsert: String,
    pub quarantine_delete: String,
    pub quarantine_len: String,
    pub quarantine_range: String,
    pub fp_owner: String,
    pub fp_upsert: String,
    pub fp_delete: String,
    pub fp_by_id: String,
    pub fp_by_id_upsert: String,
    pub fp_by_id_delete: String,
    pub cursor: String,
    pub cursor_upsert: String,
    pub cursor_delete: String,
    pub parked_range: String,
    pub parked_upsert: String,
    pub parked_delete_range: String,
    pub cursors_needed: String,
    pub ledger_range: String,
    pub ledger_upsert: String,
    pub ledger_delete_range: String,
    pub sink_lock: String,
    pub sink_xact_lock: String,
}

/// The class of replay-guard's advisory locks (the first key of the two-key form); the
/// second is `hashtext(schema)`.
pub const LOCK_CLASS: i32 = 0x7267_6431; // "rgd1"
/// The class of the relay sinks' session locks (one deliverer per sink); the second key is
/// `hashtext(schema || '/' || sink)`.
pub const SINK_LOCK_CLASS: i32 = 0x7267_6432; // "rgd2"

impl Sql {
    pub fn new(s: &str) -> Sql {
        let f = |q: &str| q.replace("{s}", s);
        Sql {
            lock: format!("SELECT pg_advisory_xact_lock({LOCK_CLASS}, hashtext('{s}'))"),
            meta_all: f("SELECT name, record FROM {s}.meta"),
            meta_upsert: f(
                "INSERT INTO {s}.meta (name, record) SELECT * FROM unnest($1::text[], $2::bytea[]) \
                 ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record",
            ),
            // The window entry is looked up by its whole key in a fenced subquery (`OFFSET 0`):
            // a plan cached while the table was small may otherwise probe by `source_no` alone
            // and filter the rest, a cost that grows with the window.
            prefetch: f(
                "SELECT b.agency, b.source_id, i.no, src.record, b.epoch, b.sequence, w.record \
                 FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) \
                   AS b(agency, source_id, epoch, sequence) \
                 LEFT JOIN {s}.source_ids i ON i.agency = b.agency AND i.source_id = b.source_id \
                 LEFT JOIN {s}.sources src ON src.no = i.no \
                 LEFT JOIN LATERAL (SELECT record FROM {s}.window_entries \
                   WHERE source_no = i.no AND epoch = b.epoch AND sequence = b.sequence \
                   OFFSET 0) w ON true",
            ),
            source_no: f("SELECT no FROM {s}.source_ids WHERE agency = $1 AND source_id = $2"),
            source_ids_insert: f("INSERT INTO {s}.source_ids (agency, source_id, no) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])"),
            source: f("SELECT record FROM {s}.sources WHERE no = $1"),
            sources_upsert: f(
                "INSERT INTO {s}.sources (no, record) SELECT * FROM unnest($1::bigint[], $2::bytea[]) \
                 ON CONFLICT (no) DO UPDATE SET record = EXCLUDED.record",
            ),
            window: f(
                "SELECT record FROM {s}.window_entries WHERE source_no = $1 AND epoch = $2 AND sequence = $3",
            ),
            effect: f("SELECT record FROM {s}.effects WHERE effect_offset = $1"),
            window_upsert: f(
                "INSERT INTO {s}.window_entries (source_no, epoch, sequence, record) \
                 SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bytea[]) \
                 ON CONFLICT (source_no, epoch, sequence) DO UPDATE SET record = EXCLUDED.record",
            ),
            window_delete: f(
                "DELETE FROM {s}.window_entries w USING unnest($1::bigint[], $2::bigint[], $3::bigint[]) \
                 AS d(source_no, epoch, sequence) \
                 WHERE w.source_no = d.source_no AND w.epoch = d.epoch AND w.sequence = d.sequence",
            ),
            // The present sequences of a range as islands (runs of consecutive sequences):
            // one row per run, however many sequences it holds.
            window_present: f(
                "SELECT min(sequence), max(sequence) FROM (SELECT sequence, \
                   sequence::numeric - row_number() OVER (ORDER BY sequence) AS island \
                   FROM {s}.window_entries WHERE source_no = $1 AND epoch = $2 \
                   AND sequence BETWEEN $3 AND $4) w \
                 GROUP BY island ORDER BY 1",
            ),
            effects_insert: f("INSERT INTO {s}.effects (effect_offset, record) \
                 SELECT * FROM unnest($1::bigint[], $2::bytea[])"),
            // The head's fields lead the record: 1 version byte + 4 varints of at most 10.
            effect_heads: f(
                "SELECT effect_offset, substring(record FROM 1 FOR 41) FROM {s}.effects \
                 WHERE effect_offset >= $1 AND effect_offset < $2 ORDER BY effect_offset LIMIT $3",
            ),
            effects_delete_range: f(
                "DELETE FROM {s}.effects WHERE effect_offset >= $1 AND effect_offset <= $2",
            ),
            audit: f("SELECT record FROM {s}.audit_log WHERE audit_index = $1"),
            audit_insert: f(
                "WITH entries AS (INSERT INTO {s}.audit_log (audit_index, record) \
                 SELECT * FROM unnest($1::bigint[], $2::bytea[])), \
                 keys AS (INSERT INTO {s}.audit_keys (bucket, audit_index) \
                 SELECT * FROM unnest($3::bigint[], $4::bigint[])) \
                 INSERT INTO {s}.audit_sources (bucket, audit_index, epoch, sequence) \
                 SELECT * FROM unnest($5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[])",
            ),
            audit_range: f("SELECT audit_index, record FROM {s}.audit_log \
                 WHERE audit_index >= $1 AND audit_index < $2 ORDER BY audit_index LIMIT $3"),
            // 1 version byte + a varint time of at most 10 + the outcome byte.
            audit_heads: f(
                "SELECT audit_index, substring(record FROM 1 FOR 12) FROM {s}.audit_log \
                 WHERE audit_index >= $1 AND audit_index < $2 ORDER BY audit_index LIMIT $3",
            ),
            audit_delete_range: f(
                "DELETE FROM {s}.audit_log WHERE audit_index >= $1 AND audit_index <= $2",
            ),
            // Buckets below 2^63 (blocks below 2^31) keep their order as bigints; the
            // source index's unnumbered buckets, above, are negative and keep theirs.
            audit_index_delete_blocks: f(
                "WITH k AS (DELETE FROM {s}.audit_keys WHERE bucket >= $1 AND bucket < $2) \
                 DELETE FROM {s}.audit_sources WHERE (bucket >= $3 AND bucket < $4) \
                 OR (bucket >= $5 AND bucket < $6)",
            ),
            quarantine: f("SELECT record FROM {s}.quarantine WHERE id = $1"),
            quarantine_upsert: f(
                "INSERT INTO {s}.quarantine (id, record) SELECT * FROM unnest($1::bigint[], $2::bytea[]) \
                 ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
            ),
            quarantine_delete: f("DELETE FROM {s}.quarantine WHERE id = ANY($1::bigint[])"),
            quarantine_len: f("SELECT count(*) FROM {s}.quarantine"),
            quarantine_range: f(
                "SELECT id, record FROM {s}.quarantine WHERE id >= $1 ORDER BY id LIMIT $2",
            ),
            fp_owner: f("SELECT id FROM {s}.quarantine_fp WHERE fp = $1"),
            fp_upsert: f(
                "INSERT INTO {s}.quarantine_fp (fp, id) SELECT * FROM unnest($1::bytea[], $2::bigint[]) \
                 ON CONFLICT (fp) DO UPDATE SET id = EXCLUDED.id",
            ),
            fp_delete: f("DELETE FROM {s}.quarantine_fp WHERE fp = ANY($1::bytea[])"),
            fp_by_id: f("SELECT fp FROM {s}.quarantine_fp_by_id WHERE id = $1"),
            fp_by_id_upsert: f(
                "INSERT INTO {s}.quarantine_fp_by_id (id, fp) SELECT * FROM unnest($1::bigint[], $2::bytea[]) \
                 ON CONFLICT (id) DO UPDATE SET fp = EXCLUDED.fp",
            ),
            fp_by_id_delete: f("DELETE FROM {s}.quarantine_fp_by_id WHERE id = ANY($1::bigint[])"),
            cursor: f("SELECT record FROM {s}.sink_cursors WHERE name = $1"),
            cursor_upsert: f(
                "INSERT INTO {s}.sink_cursors (name, record) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record",
            ),
            cursor_delete: f("DELETE FROM {s}.sink_cursors WHERE name = $1 RETURNING record"),
            parked_range: f("SELECT effect_offset, record FROM {s}.sink_parked \
                 WHERE name = $1 AND effect_offset BETWEEN $2 AND $3 ORDER BY effect_offset"),
            // `xmax = 0`: the row was inserted, not updated.
            parked_upsert: f(
                "INSERT INTO {s}.sink_parked (name, effect_offset, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (name, effect_offset) DO UPDATE SET record = EXCLUDED.record \
                 RETURNING (xmax = 0)",
            ),
            parked_delete_range: f(
                "DELETE FROM {s}.sink_parked WHERE name = $1 AND effect_offset BETWEEN $2 AND $3",
            ),
            cursors_needed: f("SELECT c.name, c.record, \
                 (SELECT min(p.effect_offset) FROM {s}.sink_parked p \
                   WHERE p.name = c.name AND p.effect_offset >= $1) \
                 FROM {s}.sink_cursors c"),
            ledger_range: f("SELECT seq, record FROM {s}.sink_ledger \
                 WHERE name = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq"),
            ledger_upsert: f(
                "INSERT INTO {s}.sink_ledger (name, seq, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (name, seq) DO UPDATE SET record = EXCLUDED.record",
            ),
            ledger_delete_range: f(
                "DELETE FROM {s}.sink_ledger WHERE name = $1 AND seq BETWEEN $2 AND $3",
            ),
            sink_lock: format!(
                "SELECT pg_try_advisory_lock({SINK_LOCK_CLASS}, hashtext('{s}/' || $1::text))"
            ),
            sink_xact_lock: format!(
                "SELECT pg_try_advisory_xact_lock({SINK_LOCK_CLASS}, hashtext('{s}/' || $1::text))"
            ),
        }
    }
}
