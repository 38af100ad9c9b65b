//! Requests paused for their body, and the tick that never lets one wait forever: a request
//! none of whose body arrived within `misdeployment.body_wait_ms` is resumed from the root
//! context and passed on unrouted (the cluster's balancing chooses); one whose body stopped
//! arriving part way for that long is answered 408. Without
//! `allow_on_headers_stop_iteration` on the wasm filter Envoy never hands the body to the
//! filter, so without this every POST would hang until its timeout.

use std::cell::RefCell;
use std::collections::HashMap;

use kvroute_core::decision::error::ApiError;
use kvroute_core::decision::misdeploy::{Unrouted, Watch};

use crate::host::Host;

/// One paused request.
#[derive(Debug, Clone, Copy)]
struct Paused {
    /// When it was paused, or when its last body chunk arrived (ms).
    progress_ms: u64,
    /// Whether any of its body reached the filter.
    got_body: bool,
}

/// A thread's paused requests (by HTTP context id) and those its tick passed on.
#[derive(Debug, Default)]
pub struct Waiting {
    paused: RefCell<HashMap<u32, Paused>>,
    passed_on: RefCell<HashMap<u32, Unrouted>>,
}

impl Waiting {
    /// `id` pauses for its body now.
    pub fn pause(&self, id: u32, now_ms: u64) {
        self.paused.borrow_mut().insert(id, Paused { progress_ms: now_ms, got_body: false });
    }

    /// A body chunk of `id` arrived.
    pub fn progress(&self, id: u32, now_ms: u64) {
        if let Some(p) = self.paused.borrow_mut().get_mut(&id) {
            p.progress_ms = now_ms;
            p.got_body = true;
        }
    }

    /// `id` no longer waits (decided, rejected, or gone).
    pub fn done(&self, id: u32) {
        self.paused.borrow_mut().remove(&id);
        self.passed_on.borrow_mut().remove(&id);
    }

    /// Why the tick passed `id` on, if it did (taken once).
    pub fn take_passed_on(&self, id: u32) -> Option<Unrouted> {
        self.passed_on.borrow_mut().remove(&id)
    }

    /// Resumes every request whose body made no progress for `body_wait_ms`; returns why each
    /// was passed on. `root_id` is the calling root context, made effective again afterwards.
    pub fn resume_expired(
        &self,
        host: &dyn Host,
        watch: &mut Watch,
        root_id: u32,
        now_ms: u64,
    ) -> Vec<Unrouted> {
        let wait = watch.config().body_wait_ms;
        let expired: Vec<(u32, Paused)> = {
            let mut paused = self.paused.borrow_mut();
            let ids: Vec<u32> = paused
                .iter()
                .filter(|(_, p)| now_ms.saturating_sub(p.progress_ms) >= wait)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter().filter_map(|id| paused.remove(&id).map(|p| (id, p))).collect()
        };
        let mut why = Vec::with_capacity(expired.len());
        for (id, p) in expired {
            let reason = watch.timed_out(p.got_body, now_ms);
            // Recorded before acting: the callbacks that follow must find it.
            self.passed_on.borrow_mut().insert(id, reason);
            if !host.set_effective_context(id) {
                continue;
            }
            let done = match reason {
                // Nothing of the body is held by the filter: the request goes on, and its body
                // streams through as it comes.
                Unrouted::BodyNotDelivered => host.resume_request(),
                // Resuming would forward the part the filter buffered and then, in Envoy 1.40,
                // the same part again (the upstream sees a corrupt body): answer 408 instead,
                // as Envoy's own request timeout does.
                Unrouted::BodyTimeout => {
                    let e = ApiError::body_timeout(now_ms.saturating_sub(p.progress_ms));
                    let headers = [("content-type", "application/json")];
                    host.send_response(e.status, &headers, &e.body())
                }
            };
            if !done {
                log::warn!("kvroute: cannot pass on a request waiting for its body");
            }
            why.push(reason);
        }
        host.set_effective_context(root_id);
        why
    }
}

#[cfg(test)]
mod tests;
