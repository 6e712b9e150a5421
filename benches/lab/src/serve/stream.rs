//! A request's answer as it is generated: the server-sent-event body of a
//! streamed request, and the wait for every token of one that is not.
//!
//! Both hold a [`Ticket`]: dropped before the request's last token, which
//! is what hyper does with a response body or a handler future when the
//! client disconnects, it aborts the request in its rank.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, SizeHint};
use tokio::sync::mpsc::UnboundedReceiver;

use super::openai::Writer;
use super::rank::Rank;
use crate::engine::Token;

/// A request in a rank, aborted there if dropped before it finished.
#[derive(Debug)]
pub struct Ticket {
    rank: Arc<Rank>,
    id: u64,
    finished: bool,
}

impl Ticket {
    /// The request `id` just submitted to `rank`.
    pub fn new(rank: Arc<Rank>, id: u64) -> Self {
        Self {
            rank,
            id,
            finished: false,
        }
    }

    /// The request produced its last token: nothing to abort.
    pub fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.finished {
            self.rank.abort(self.id);
        }
    }
}

/// Waits for every token of a request; the number generated, or `None` if
/// its channel closed first (the rank no longer holds it).
pub async fn collect(mut tokens: UnboundedReceiver<Token>, mut ticket: Ticket) -> Option<u32> {
    while let Some(t) = tokens.recv().await {
        if t.finished {
            ticket.finish();
            return Some(t.generated);
        }
    }
    None
}

/// The body of a streamed answer: the opening chunk at once, then each
/// step's tokens of this request as one write (however many arrived since
/// the last poll), then the usage chunk if asked and `data: [DONE]`.
#[derive(Debug)]
pub struct EventStream {
    tokens: UnboundedReceiver<Token>,
    ticket: Ticket,
    writer: Writer,
    include_usage: bool,
    opened: bool,
    ended: bool,
}

impl EventStream {
    /// The stream of a request whose tokens arrive on `tokens`.
    pub fn new(
        tokens: UnboundedReceiver<Token>,
        ticket: Ticket,
        writer: Writer,
        include_usage: bool,
    ) -> Self {
        Self {
            tokens,
            ticket,
            writer,
            include_usage,
            opened: false,
            ended: false,
        }
    }

    /// Appends `t`'s chunk, and the stream's end after the last token.
    fn write(&mut self, out: &mut String, t: Token) {
        self.writer.token(out, t.finished);
        if t.finished {
            if self.include_usage {
                self.writer.usage(out, t.generated);
            }
            Writer::done(out);
            self.ticket.finish();
            self.ended = true;
        }
    }
}

impl Body for EventStream {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let mut out = String::new();
        if !this.opened {
            this.opened = true;
            this.writer.opening(&mut out);
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
            }
        }
        match this.tokens.poll_recv(cx) {
            // The rank no longer holds the request: the stream ends without
            // its last tokens (and without `[DONE]`, so the client sees a
            // cut stream as one).
            Poll::Ready(None) => {
                this.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(t)) => {
                this.write(&mut out, t);
                while !this.ended {
                    match this.tokens.try_recv() {
                        Ok(t) => this.write(&mut out, t),
                        Err(_) => break,
                    }
                }
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
