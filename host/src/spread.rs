//! Host work spread over the kernels' threads while the device idles
//! between steps (a step's rows read into distributions, its rounds'
//! acceptance calls).

/// Runs `f` on every lane, the first on this thread and each other on a
/// scoped thread of its own; the outputs in lane order. A panic in a lane
/// resumes here.
pub fn on_threads<I: Send, O: Send>(lanes: Vec<I>, f: impl Fn(I) -> O + Sync) -> Vec<O> {
    let mut lanes = lanes.into_iter();
    let Some(first) = lanes.next() else {
        return Vec::new();
    };
    let f = &f;
    std::thread::scope(|s| {
        let others: Vec<_> = lanes.map(|l| s.spawn(move || f(l))).collect();
        let mut out = vec![f(first)];
        for h in others {
            match h.join() {
                Ok(o) => out.push(o),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}
