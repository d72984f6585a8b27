//! Point lookups for `explain`: a source's marks and whether a position is still in the dedup
//! window, read through a `Snapshot`.

use super::StoreError;
use super::read::Snapshot;
use super::tables::*;
use crate::decide::{Seen, SourceMarks};
use crate::model::{Digest, Position};

/// What the store knows now about one position of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionState {
    /// The source's high-water mark and evicted floor.
    pub marks: SourceMarks,
    /// The window's entry for the position (digest and effect offset), if still in the window.
    pub seen: Option<Seen>,
}

fn r<E: Into<redb::Error>>(e: E) -> StoreError {
    StoreError::redb(e)
}

fn pos((epoch, sequence): (u64, u64)) -> Position {
    Position { epoch, sequence }
}

impl Snapshot {
    /// The marks of source (`agency`, `source_id`) and the window entry of `position`; `None`
    /// if the source never had a message applied.
    pub fn position_state(
        &self,
        agency: &str,
        source_id: &str,
        position: Position,
    ) -> Result<Option<PositionState>, StoreError> {
        if let Some(pg) = self.pg() {
            let Some(no) = pg.source_no(agency, source_id)? else {
                return Ok(None);
            };
            let record: SourceRecord = pg.get("sources", "no", no)?.ok_or_else(|| RecordError {
                table: "sources",
                key: no.to_string(),
                why: "missing (named in source_ids)".into(),
            })?;
            let seen = pg
                .window((no, position.epoch, position.sequence))?
                .map(|w| Seen {
                    digest: Digest::from_bytes(w.digest),
                    effect_offset: w.effect_offset,
                });
            return Ok(Some(PositionState {
                marks: SourceMarks {
                    high_water: pos(record.high_water),
                    evicted_floor: record.evicted_floor.map(pos),
                },
                seen,
            }));
        }
        self.guard(|txn| {
            let ids = txn.open_table(SOURCE_IDS).map_err(r)?;
            let Some(no) = ids.get((agency, source_id)).map_err(r)?.map(|g| g.value()) else {
                return Ok(None);
            };
            let sources = txn.open_table(SOURCES).map_err(r)?;
            let record: SourceRecord = match sources.get(no).map_err(r)? {
                Some(g) => decode("sources", no, g.value())?,
                None => {
                    return Err(RecordError {
                        table: "sources",
                        key: no.to_string(),
                        why: "missing (named in source_ids)".into(),
                    }
                    .into());
                }
            };
            let window = txn.open_table(WINDOW).map_err(r)?;
            let wkey = (no, position.epoch, position.sequence);
            let seen = match window.get(wkey).map_err(r)? {
                Some(g) => {
                    let w: WindowRecord = decode("window", format_args!("{wkey:?}"), g.value())?;
                    Some(Seen {
                        digest: Digest::from_bytes(w.digest),
                        effect_offset: w.effect_offset,
                    })
                }
                None => None,
            };
            Ok(Some(PositionState {
                marks: SourceMarks {
                    high_water: pos(record.high_water),
                    evicted_floor: record.evicted_floor.map(pos),
                },
                seen,
            }))
        })
    }
}
