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
        let key = |no| (no, position.epoch, position.sequence);
        let found = match self.pg() {
            Some(pg) => match pg.source_no(agency, source_id)? {
                Some(no) => Some((no, pg.get(SOURCES, no)?, pg.window(key(no))?)),
                None => None,
            },
            None => self.guard(|txn| {
                let ids = txn.open_table(SOURCE_IDS)?;
                let Some(no) = ids.get((agency, source_id))? else {
                    return Ok(None);
                };
                let no = no.value();
                let window = WINDOW.open(txn)?.get(key(no))?;
                Ok::<_, StoreError>(Some((no, SOURCES.open(txn)?.get(no)?, window)))
            })?,
        };
        let Some((no, record, window)) = found else {
            return Ok(None);
        };
        let record = record.ok_or_else(|| SOURCES.missing(&no, "missing (named in source_ids)"))?;
        Ok(Some(PositionState {
            marks: SourceMarks {
                high_water: pos(record.high_water),
                evicted_floor: record.evicted_floor.map(pos),
            },
            seen: window.map(|w| Seen {
                digest: Digest::from_bytes(w.digest),
                effect_offset: w.effect_offset,
            }),
        }))
    }
}
