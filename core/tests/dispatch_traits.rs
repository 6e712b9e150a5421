//! What the handles of `Monitor::dispatch` are across threads, as their
//! docs say and the bindings rely on:
//! - [`Dispatch`], a request sent to a worker, is `Send` and `Sync`: it is
//!   completed on any thread, and the C ABI reads its worker and rank from
//!   several at once (`lg_dispatch_worker`, `lg_dispatch_dp_rank`);
//! - [`Dispatching`], the future of one that may wait, is `Send` and `Sync`
//!   (a multi-threaded runtime may move its task), and `Unpin`, so it is
//!   polled through `Pin::new`, as `Monitor::dispatch_blocking` does;
//! - neither is `Clone`: a request completes once, and a wait is given up
//!   once.
//!
//! Each claim is checked when this file compiles, the positive ones by
//! trait bounds (as `gate_config.rs` checks the gate's handles), the
//! negative ones by a call that is ambiguous for a type with the trait.

use loadgate::monitor::{Dispatch, Dispatching};

fn send_sync<T: Send + Sync>() {}
fn unpin<T: Unpin>() {}

/// `<T as NotClone<_>>::check` names one function when `T` is not `Clone`,
/// and is ambiguous (a compile error) when it is: every type has the
/// `NotClone<()>` impl, and a `Clone` type the `NotClone<IsClone>` one too.
trait NotClone<A> {
    fn check() {}
}
impl<T: ?Sized> NotClone<()> for T {}
struct IsClone;
impl<T: Clone> NotClone<IsClone> for T {}

#[test]
fn a_dispatch_is_send_and_sync_and_not_clone() {
    send_sync::<Dispatch>();
    <Dispatch as NotClone<_>>::check();
}

#[test]
fn the_future_of_a_dispatch_is_send_sync_and_unpin_and_not_clone() {
    send_sync::<Dispatching>();
    unpin::<Dispatching>();
    <Dispatching as NotClone<_>>::check();
}
