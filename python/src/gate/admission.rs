//! `loadgate.Admission`: `gate.admit()`, a native coroutine.
//!
//! # asyncio without polling
//!
//! `gate.admit()` returns an [`Admission`]: a native object that speaks the
//! coroutine protocol (`send`, `throw`, `close`, `__await__`, `__next__`) and
//! is registered as a `collections.abc.Coroutine`, so `await`,
//! `asyncio.create_task`, `ensure_future`, `gather`, `wait_for` and
//! `TaskGroup` all take it, without a Python frame per admission.
//!
//! Its first step asks the core in two steps
//! ([`loadgate::AdmissionGate::admit_pending_at`]): admitted or refused at
//! once, it returns the permit or raises; queued, it makes an asyncio future
//! and arms the request with a callback that settles it
//! ([`loadgate::PendingAdmission::arm`]), unless the request was resolved
//! meanwhile, whose outcome the arm returns instead. Only a request that
//! queues touches the event loop, and the core never calls the callback
//! before the arm, so the binding keeps no state for an early outcome. The
//! callback runs once, on whichever thread granted, expired or closed the
//! request:
//!
//! * on the loop's own thread (a release, `set_limit`, `close` or `expire`
//!   called from a task), it settles the future directly;
//! * on any other thread, it hands the outcome to the loop with
//!   `loop.call_soon_threadsafe`.
//!
//! Cancelling the awaiting task cancels the future and throws
//! `CancelledError` into the admission, which cancels the core ticket: the
//! queue place is free at once, and the request counts as cancelled, not
//! rejected. `throw()` of any other exception, `close()` and garbage
//! collection of a queued admission do the same. If the ticket was already
//! granted, the permit is in the future or on its way to it, and is
//! released (at once, or when it arrives and finds the future cancelled).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use loadgate::{AdmitError, CallbackTicket, OwnedPermit, Pending};
use pyo3::exceptions::{PyBaseException, PyRuntimeError, PyStopIteration, PyTypeError};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};
use pyo3::PyTraverseError;

use super::timer::Shared;
use super::{lock, Permit};
use crate::errors::{admit_error, admit_value};

/// `asyncio.get_running_loop()`.
fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()
}

/// `event_loop.create_future()`. On asyncio's own loops (exactly
/// `asyncio.SelectorEventLoop` or `ProactorEventLoop`, whose method is
/// `BaseEventLoop.create_future`: `return futures.Future(loop=self)`), the
/// same future is made here, without that method's Python frame; any other
/// loop (uvloop, or a subclass, which may override the method) is asked.
fn new_future<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    static STOCK: PyOnceLock<(Vec<Py<PyAny>>, Py<PyAny>)> = PyOnceLock::new();
    let py = event_loop.py();
    let (stock_loops, future) = STOCK.get_or_try_init(py, || -> PyResult<_> {
        let asyncio = py.import("asyncio")?;
        let mut loops = Vec::new();
        for name in ["SelectorEventLoop", "ProactorEventLoop"] {
            if let Ok(class) = asyncio.getattr(name) {
                loops.push(class.unbind());
            }
        }
        Ok((loops, asyncio.getattr("Future")?.unbind()))
    })?;
    let class = event_loop.get_type();
    if !stock_loops.iter().any(|stock| class.is(stock)) {
        return event_loop.call_method0(intern!(py, "create_future"));
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "loop"), event_loop)?;
    future.bind(py).call((), Some(&kwargs))
}

/// What a finished admission gives: a permit or the refusal.
type Outcome = Result<OwnedPermit, AdmitError>;

/// A pending admission, `gate.admit()`: a coroutine (it implements the
/// coroutine protocol and is a `collections.abc.Coroutine`) that returns a
/// `Permit`. Await it once, run it as a task, or use it with `async with`
/// (the permit is released when the block ends).
#[pyclass(frozen, freelist = 64, module = "loadgate")]
pub struct Admission {
    gate: Arc<Shared>,
    /// The request's priority class.
    priority: u8,
    /// Set by `__aenter__`: the permit is kept for `__aexit__`.
    entered: AtomicBool,
    state: Mutex<State>,
}

struct State {
    step: Step,
    /// The permit, kept for `__aexit__`.
    permit: Option<Py<Permit>>,
}

/// Where the coroutine is.
enum Step {
    /// Not started.
    New,
    /// Queued: suspended on `Queued::fut`.
    Queued(Queued),
    /// Returned, raised or closed.
    Done,
}

/// A queued admission's loop-side state.
struct Queued {
    /// The asyncio future the core callback settles.
    fut: Py<PyAny>,
    ticket: CallbackTicket,
    /// The event loop whose deadline timer counted this admission in.
    timed: Option<Py<PyAny>>,
}

/// Where a queued admission's outcome goes: its future, on its loop, whose
/// thread is `thread`. The core calls the armed callback at most once, and
/// never before `arm` returned (`loadgate::PendingAdmission::arm`), so the
/// future always exists by then.
struct Target {
    fut: Py<PyAny>,
    event_loop: Py<PyAny>,
    thread: u64,
}

/// The calling thread's number, unique in the process: cheaper to read than
/// `thread::current().id()`, which clones a reference-counted handle.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static NUMBER: Cell<u64> = const { Cell::new(0) });
    NUMBER.with(|n| {
        if n.get() == 0 {
            n.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        n.get()
    })
}

/// Routes an outcome to its future: directly on the loop's thread, through
/// `call_soon_threadsafe` from any other.
fn deliver_to(py: Python<'_>, target: &Target, outcome: Outcome) {
    let Target {
        fut,
        event_loop,
        thread,
    } = target;
    let (value, ok) = match outcome {
        Ok(p) => match Bound::new(py, Permit::new(p)) {
            Ok(p) => (p.into_any(), true),
            Err(e) => return e.write_unraisable(py, None),
        },
        Err(e) => match admit_value(py, e) {
            Ok(v) => (v, false),
            Err(e) => return e.write_unraisable(py, None),
        },
    };
    if thread_number() == *thread {
        settle(py, fut.bind(py), &value, ok);
        return;
    }
    let handed = Bound::new(
        py,
        Settle {
            fut: fut.clone_ref(py),
        },
    )
    .and_then(|settle| {
        event_loop.bind(py).call_method1(
            intern!(py, "call_soon_threadsafe"),
            (settle, value.clone(), ok),
        )
    });
    if handed.is_err() {
        // The loop is closed: nobody will take the slot.
        release_value(&value, ok);
    }
}

/// What a step of an [`Admission`] gives when it does not raise.
enum Stepped<'py> {
    /// Suspended: the future to wait on.
    Yield(Bound<'py, PyAny>),
    /// Finished: the permit the coroutine returns.
    Return(Bound<'py, PyAny>),
}

impl<'py> Stepped<'py> {
    /// As `send()` gives it: the future yielded, or `StopIteration(permit)`
    /// raised.
    fn into_send(self) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Stepped::Yield(fut) => Ok(fut),
            Stepped::Return(permit) => {
                let py = permit.py();
                // A ready instance: cheaper to raise than a lazily built one.
                let stop = py.get_type::<PyStopIteration>().call1((permit,))?;
                Err(PyErr::from_value(stop))
            }
        }
    }

    /// As `__next__` gives it: the future yielded, or `None` (the slot
    /// returns NULL) with `StopIteration(permit)` set here. `__next__` is
    /// `tp_iternext`, through which `await` and asyncio's tasks step the
    /// coroutine, and NULL with `StopIteration` set is how CPython's own
    /// generators return a value there. Set as a type and a value, it is
    /// not normalized before Python 3.12: the interpreter takes the value
    /// without building the exception (PyO3's error path would build it).
    fn into_next(self) -> Option<Bound<'py, PyAny>> {
        match self {
            Stepped::Yield(fut) => Some(fut),
            Stepped::Return(permit) => {
                // SAFETY: the thread is attached (`permit` is bound to it);
                // both pointers are valid and `PyErr_SetObject` takes its
                // own references. The permit is never a tuple or an
                // exception, which the call would read as arguments.
                unsafe { ffi::PyErr_SetObject(ffi::PyExc_StopIteration, permit.as_ptr()) };
                None
            }
        }
    }
}

impl Admission {
    pub(super) fn new(gate: Arc<Shared>, priority: u8) -> Self {
        Self {
            gate,
            priority,
            entered: AtomicBool::new(false),
            state: Mutex::new(State {
                step: Step::New,
                permit: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Takes the step, leaving `Done` (the caller puts back what goes on).
    fn take_step(&self) -> Step {
        std::mem::replace(&mut self.state().step, Step::Done)
    }

    /// One step of the coroutine: the future to wait on or the permit, or
    /// the refusal.
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Stepped<'py>> {
        match self.take_step() {
            Step::New => self.start(py),
            Step::Queued(q) => self.resume(py, q),
            Step::Done => Err(PyRuntimeError::new_err(
                "this admission was already awaited; call gate.admit() again",
            )),
        }
    }

    /// The first step: admitted or refused at once, or queued.
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Stepped<'py>> {
        let pending = match self.gate.core.admit_pending_at(self.priority) {
            Pending::Ready(outcome) => return self.finish(py, outcome),
            Pending::Queued(pending) => pending,
        };
        // Queued: wait for the outcome on the running loop. Without one (or
        // without a future), `pending` is dropped: the request leaves the
        // queue, or gives back the slot it was granted meanwhile.
        let event_loop = running_loop(py)?;
        let fut = new_future(&event_loop)?;
        fut.setattr(intern!(py, "_asyncio_future_blocking"), true)?;
        let target = Target {
            fut: fut.clone().unbind(),
            event_loop: event_loop.clone().unbind(),
            thread: thread_number(),
        };
        let armed = pending.arm(Box::new(move |outcome| {
            Python::attach(|py| deliver_to(py, &target, outcome));
        }));
        let ticket = match armed {
            Ok(ticket) => ticket,
            // Resolved before the arm: no need for the loop after all.
            Err(outcome) => return self.finish(py, outcome),
        };
        let mut queued = Queued {
            fut: fut.clone().unbind(),
            ticket,
            timed: None,
        };
        match self.gate.join(py, &event_loop) {
            Ok(timed) => queued.timed = timed.then(|| event_loop.unbind()),
            Err(e) => {
                self.abandon(py, queued);
                return Err(e);
            }
        }
        self.state().step = Step::Queued(queued);
        Ok(Stepped::Yield(fut))
    }

    /// A later step: the future is done (the awaiting task was woken), so
    /// return its permit or raise its refusal.
    fn resume<'py>(&self, py: Python<'py>, q: Queued) -> PyResult<Stepped<'py>> {
        let fut = q.fut.bind(py).clone();
        // `result()` first: `done()` is asked only when it raises.
        let err = match fut.call_method0(intern!(py, "result")) {
            Ok(permit) => {
                if let Some(event_loop) = &q.timed {
                    self.gate.leave(Some(py), event_loop);
                }
                return Ok(self.returned(permit));
            }
            Err(e) => e,
        };
        let done = fut
            .call_method0(intern!(py, "done"))
            .and_then(|d| d.is_truthy());
        if let Ok(false) = done {
            // Stepped before the outcome came (not by an asyncio task, which
            // waits for the future): wait on it again.
            if let Err(e) = fut.setattr(intern!(py, "_asyncio_future_blocking"), true) {
                self.abandon(py, q);
                return Err(e);
            }
            self.state().step = Step::Queued(q);
            return Ok(Stepped::Yield(fut));
        }
        // A refusal, or the future was cancelled (then the request leaves
        // the queue).
        self.abandon(py, q);
        Err(err)
    }

    /// The coroutine's end for an outcome: the permit or the refusal.
    fn finish<'py>(&self, py: Python<'py>, outcome: Outcome) -> PyResult<Stepped<'py>> {
        match outcome {
            Ok(p) => Ok(self.returned(Bound::new(py, Permit::new(p))?.into_any())),
            Err(e) => Err(admit_error(py, e)),
        }
    }

    /// The permit returned; it is kept for `__aexit__` inside `async with`.
    fn returned<'py>(&self, permit: Bound<'py, PyAny>) -> Stepped<'py> {
        if self.entered.load(Ordering::Relaxed) {
            self.state().permit = permit.cast::<Permit>().ok().map(|p| p.clone().unbind());
        }
        Stepped::Return(permit)
    }

    /// Ends a queued admission that is collected without being finished
    /// (its task was destroyed, or its loop closed), calling no Python: it
    /// leaves the queue; a permit already in its future is released with
    /// the future.
    fn forget(&self, step: Step) {
        if let Step::Queued(q) = step {
            q.ticket.cancel();
            if let Some(event_loop) = &q.timed {
                self.gate.leave(None, event_loop);
            }
        }
    }

    /// Ends a queued admission that will not take its outcome: it leaves
    /// the queue if still there; a permit already granted is released (now
    /// if it is in the future, on arrival if it is on its way).
    fn abandon(&self, py: Python<'_>, q: Queued) {
        if !q.ticket.cancel() {
            let fut = q.fut.bind(py);
            let done = fut
                .call_method0(intern!(py, "done"))
                .and_then(|d| d.is_truthy())
                .unwrap_or(false);
            if done {
                release_unclaimed(py, fut);
            } else {
                // On its way from another thread: `settle` finds the future
                // done and releases it. (Fails only on a closed loop.)
                let _ = fut.call_method0(intern!(py, "cancel"));
            }
        }
        if let Some(event_loop) = &q.timed {
            self.gate.leave(Some(py), event_loop);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let step = std::mem::replace(&mut state.step, Step::Done);
        self.forget(step);
    }
}

/// The exception `throw(typ, val, tb)` raises, as a generator's `throw`
/// builds it.
fn thrown(
    py: Python<'_>,
    typ: &Bound<'_, PyAny>,
    val: Option<&Bound<'_, PyAny>>,
    tb: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyErr> {
    let val = val.filter(|v| !v.is_none());
    let exc = if typ.is_instance_of::<PyBaseException>() {
        if val.is_some() {
            return Err(PyTypeError::new_err(
                "instance exception may not have a separate value",
            ));
        }
        typ.clone()
    } else {
        let class = typ
            .cast::<PyType>()
            .ok()
            .filter(|t| t.is_subclass_of::<PyBaseException>().unwrap_or(false));
        let Some(class) = class else {
            let got = typ
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            return Err(PyTypeError::new_err(format!(
                "exceptions must be classes or instances deriving from BaseException, not {got}"
            )));
        };
        match val {
            None => class.call0()?,
            Some(v) if v.is_instance(class)? => v.clone(),
            Some(v) => match v.cast::<PyTuple>() {
                Ok(args) => class.call1(args)?,
                Err(_) => class.call1((v,))?,
            },
        }
    };
    if let Some(tb) = tb.filter(|t| !t.is_none()) {
        exc.call_method1(intern!(py, "with_traceback"), (tb,))?;
    }
    Ok(PyErr::from_value(exc))
}

#[pymethods]
impl Admission {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// A queued admission is in a cycle (its task holds it, it holds its
    /// future, whose callback holds the task): the collector must see it,
    /// so that an abandoned one (its loop closed with the task pending) is
    /// collected and leaves the queue.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // Never blocks: the state lock is only taken with the GIL held.
        let Ok(st) = self.state.try_lock() else {
            return Ok(());
        };
        if let Step::Queued(q) = &st.step {
            visit.call(&q.fut)?;
            visit.call(&q.timed)?;
        }
        visit.call(&st.permit)?;
        Ok(())
    }

    fn __clear__(&self) {
        let (step, permit) = {
            let mut st = self.state();
            (
                std::mem::replace(&mut st.step, Step::Done),
                st.permit.take(),
            )
        };
        self.forget(step);
        drop(permit);
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(self.step(py)?.into_next())
    }

    /// Resumes the coroutine; as for any coroutine, only `None` may be sent
    /// to start it.
    #[pyo3(signature = (value, /))]
    fn send<'py>(&self, py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if !value.is_none() && matches!(self.state().step, Step::New) {
            return Err(PyTypeError::new_err(
                "can't send non-None value to a just-started coroutine",
            ));
        }
        self.step(py)?.into_send()
    }

    /// Raises the exception in the coroutine, which ends it: a queued
    /// request leaves the queue (cancelled, not refused), and a permit
    /// already granted is released.
    #[pyo3(signature = (typ, val = None, tb = None, /))]
    fn throw(
        &self,
        py: Python<'_>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let err = thrown(py, typ, val, tb)?;
        if let Step::Queued(q) = self.take_step() {
            self.abandon(py, q);
        }
        Err(err)
    }

    /// Ends the coroutine: a queued request leaves the queue, and a permit
    /// already granted is released.
    fn close(&self, py: Python<'_>) {
        if let Step::Queued(q) = self.take_step() {
            self.abandon(py, q);
        }
    }

    /// The future the coroutine waits on, while queued.
    #[getter]
    fn cr_await(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        match &self.state().step {
            Step::Queued(q) => Some(q.fut.clone_ref(py)),
            _ => None,
        }
    }

    #[getter(__name__)]
    fn name(&self) -> &'static str {
        "admit"
    }

    #[getter(__qualname__)]
    fn qualname(&self) -> &'static str {
        "AdmissionGate.admit"
    }

    fn __aenter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf.get().entered.store(true, Ordering::Relaxed);
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__(&self, _exc: &Bound<'_, PyTuple>) -> Ready {
        let permit = self.state().permit.take();
        if let Some(p) = permit {
            p.get().release();
        }
        Ready
    }

    fn __repr__(&self) -> String {
        let state = match self.state().step {
            Step::New => "not awaited",
            Step::Queued(_) => "queued",
            Step::Done => "done",
        };
        format!("<loadgate.Admission {state}>")
    }
}

/// An awaitable that is already done (what `__aexit__` returns).
#[pyclass(frozen, module = "loadgate", name = "_Ready")]
pub struct Ready;

#[pymethods]
impl Ready {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self) -> Option<bool> {
        None
    }
}

/// Gives back the slot of a permit nobody will receive.
fn release_value(value: &Bound<'_, PyAny>, ok: bool) {
    if ok {
        if let Ok(p) = value.cast::<Permit>() {
            p.get().release();
        }
    }
}

/// Releases a permit a done future holds that will never be taken.
fn release_unclaimed(py: Python<'_>, fut: &Bound<'_, PyAny>) {
    let holds_permit = || -> PyResult<Option<Bound<'_, PyAny>>> {
        if fut.call_method0(intern!(py, "cancelled"))?.is_truthy()?
            || !fut.call_method0(intern!(py, "exception"))?.is_none()
        {
            return Ok(None);
        }
        fut.call_method0(intern!(py, "result")).map(Some)
    };
    if let Ok(Some(value)) = holds_permit() {
        release_value(&value, true);
    }
}

/// Sets the future's result or exception; if it is already done (or its
/// loop closed), a permit is released instead.
fn settle(py: Python<'_>, fut: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>, ok: bool) {
    let method = if ok {
        intern!(py, "set_result")
    } else {
        intern!(py, "set_exception")
    };
    if call_method_with(fut, method, value).is_err() {
        // The future was cancelled (`InvalidStateError`), or the loop was
        // closed under it.
        release_value(value, ok);
    }
}

/// `obj.name(arg)` through `PyObject_CallMethodObjArgs`, which builds no
/// bound method and no argument tuple (PyO3's `call_method1` builds both).
fn call_method_with<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    arg: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the thread is attached (the arguments are bound to it); the
    // pointers are valid for the call, and the list ends with NULL.
    unsafe {
        let result = ffi::PyObject_CallMethodObjArgs(
            obj.as_ptr(),
            name.as_ptr(),
            arg.as_ptr(),
            std::ptr::null_mut::<ffi::PyObject>(),
        );
        Bound::from_owned_ptr_or_err(obj.py(), result)
    }
}

/// `call_soon_threadsafe` target that settles a future on its loop.
#[pyclass(frozen, module = "loadgate", name = "_Settle")]
pub struct Settle {
    fut: Py<PyAny>,
}

#[pymethods]
impl Settle {
    fn __call__(&self, py: Python<'_>, value: &Bound<'_, PyAny>, ok: bool) {
        settle(py, self.fut.bind(py), value, ok);
    }
}
