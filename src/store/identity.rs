//! The store's identity (`tables::StoreIdentity`): a random id that a sink keeping its own
//! cursor (the postgres sink's row) records beside it, so that a cursor is only ever adopted
//! by the store whose offsets it counts.
//!
//! The id names one history of effect offsets. A store gets it when it is made (a store made
//! before ids existed: at its first open by a writer). `backup` and `migrate --from` copy it
//! with a mark saying the file or schema is a copy; the copy's first writer (the restored
//! backup's `run`, the migrated schema's first member) draws a new id and keeps where it came
//! from in `derived_from`. From then on the copy's offsets are another history than the
//! original's (both may go on), and neither adopts the other's cursors.

use super::StoreError;
use super::tables::{CopyMark, StoreIdentity};
use crate::model::hex;

/// What a writer's open makes of the stored identity: `Some(new)` to store when there is
/// none, or when it is a copy's; `None` when it stands.
pub fn settled(stored: Option<StoreIdentity>) -> Result<Option<StoreIdentity>, StoreError> {
    let fresh = || {
        crate::entropy::random_id()
            .map_err(|e| StoreError::Refused(format!("cannot draw the store's random id: {e}")))
    };
    match stored {
        Some(StoreIdentity { copy: None, .. }) => Ok(None),
        Some(StoreIdentity {
            copy: Some(mark), ..
        }) => Ok(Some(StoreIdentity {
            id: fresh()?,
            copy: None,
            derived_from: Some(mark),
        })),
        None => Ok(Some(StoreIdentity {
            id: fresh()?,
            copy: None,
            derived_from: None,
        })),
    }
}

/// The identity a copy (`how`: "backup" or "migrate") of a store with `identity` carries:
/// the same id, marked as a copy made at `made_at_ms` holding the offsets below
/// `next_effect`. `None` for a store without an id (made before ids, never opened by a
/// writer since): the copy's first writer draws one.
pub fn copied(
    identity: Option<StoreIdentity>,
    how: &str,
    made_at_ms: u64,
    next_effect: u64,
) -> Option<StoreIdentity> {
    identity.map(|i| StoreIdentity {
        copy: Some(CopyMark {
            of: i.id,
            how: how.to_string(),
            made_at_ms,
            next_effect,
        }),
        ..i
    })
}

/// The id as text: 32 lower-case hex digits.
pub fn show(id: &[u8; 16]) -> String {
    hex(id)
}
