//! hyper's I/O traits over a tokio stream, for the `http` sink's client connections and the
//! metrics endpoint's server connections.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// hyper's I/O traits over a tokio stream: what hyper-util's `TokioIo` does, without its
/// `unsafe` zero-copy read (this crate forbids `unsafe`); one copy per read is nothing beside
/// a network round trip.
pub(crate) struct Io<S>(pub(crate) S);

/// Bytes read per `poll_read` (hyper asks for at most its buffer's free space).
const READ_CHUNK: usize = 8192;

impl<S: AsyncRead + Unpin> hyper::rt::Read for Io<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let mut tmp = [0u8; READ_CHUNK];
        let n = buf.remaining().min(READ_CHUNK);
        let mut rb = ReadBuf::new(&mut tmp[..n]);
        ready!(Pin::new(&mut self.0).poll_read(cx, &mut rb))?;
        buf.put_slice(rb.filled());
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> hyper::rt::Write for Io<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}
