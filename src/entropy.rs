//! Random bytes from the kernel (`/dev/urandom`), std only: the store's id is the one thing
//! replay-guard draws at random.

use std::io::Read as _;

/// 16 random bytes.
pub fn random_id() -> std::io::Result<[u8; 16]> {
    let mut id = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut id)?;
    Ok(id)
}
