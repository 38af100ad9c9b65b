//! An in-memory [`Host`] for tests: shared data ([`MemStore`]), a settable clock, the HTTP
//! calls sent, the answer being delivered, headers, and the metrics by name.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use kvroute_core::shared::fake::MemStore;
use kvroute_core::shared::{SharedStore, StoreError, Versioned};
use proxy_wasm::types::{Bytes, MetricType};

use crate::host::{Buffer, Headers, Host, Map};

/// One HTTP call sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    pub timeout_ms: u64,
}

impl Sent {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn path(&self) -> &str {
        self.header(":path").unwrap_or_default()
    }
}

#[derive(Debug, Default)]
pub struct FakeHost {
    pub store: MemStore,
    pub now_ms: Cell<u64>,
    pub refuse_calls: Cell<bool>,
    pub tick_ms: Cell<Option<u64>>,
    /// The effective context, and what was done to each: resumed, or answered (status).
    pub effective: Cell<u32>,
    pub resumed: RefCell<Vec<u32>>,
    pub replied: RefCell<Vec<(u32, u16)>>,
    next_token: Cell<u32>,
    sent: RefCell<Vec<Sent>>,
    pub headers: RefCell<HashMap<(Map, String), Vec<u8>>>,
    pub bodies: RefCell<HashMap<Buffer, Vec<u8>>>,
    /// Metric name → (kind, id, value).
    metrics: RefCell<HashMap<String, (MetricType, u32, u64)>>,
    /// Shared queues, id `i + 1` at `i`: (name, messages), all registered in [`FAKE_VM_ID`].
    pub queues: RefCell<Vec<(String, std::collections::VecDeque<Vec<u8>>)>>,
}

/// The VM id the fake host reports (`plugin_vm_id`) and registers queues in.
pub const FAKE_VM_ID: &str = "kvroute";

impl FakeHost {
    pub fn at(now_ms: u64) -> Self {
        let h = FakeHost::default();
        h.now_ms.set(now_ms);
        h
    }

    /// Takes the calls sent so far.
    pub fn take_sent(&self) -> Vec<Sent> {
        std::mem::take(&mut self.sent.borrow_mut())
    }

    /// The next call's answer: status and body.
    pub fn answer(&self, status: u16, body: &[u8]) {
        let mut h = self.headers.borrow_mut();
        h.retain(|(m, _), _| *m != Map::CallResponse);
        h.insert((Map::CallResponse, ":status".into()), status.to_string().into_bytes());
        self.bodies.borrow_mut().insert(Buffer::CallResponse, body.to_vec());
    }

    /// A metric's value (`None`: never defined).
    pub fn metric(&self, name: &str) -> Option<u64> {
        self.metrics.borrow().get(name).map(|(_, _, v)| *v)
    }
}

impl SharedStore for FakeHost {
    fn get(&self, key: &str) -> Versioned {
        self.store.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        self.store.set(key, value, cas)
    }
}

impl Host for FakeHost {
    fn header(&self, map: Map, name: &str) -> Option<Bytes> {
        self.headers.borrow().get(&(map, name.to_owned())).cloned()
    }

    fn set_header(&self, map: Map, name: &str, value: Option<&str>) -> bool {
        let mut h = self.headers.borrow_mut();
        match value {
            Some(v) => h.insert((map, name.to_owned()), v.as_bytes().to_vec()),
            None => h.remove(&(map, name.to_owned())),
        };
        true
    }

    fn body(&self, buffer: Buffer, size: usize) -> Option<Bytes> {
        let b = self.bodies.borrow();
        let body = b.get(&buffer)?;
        Some(body[..size.min(body.len())].to_vec())
    }

    fn property(&self, path: &[&str]) -> Option<Bytes> {
        (path == ["plugin_vm_id"]).then(|| FAKE_VM_ID.as_bytes().to_vec())
    }

    fn send_response(&self, status: u16, _headers: &[(&str, &str)], _body: &[u8]) -> bool {
        self.replied.borrow_mut().push((self.effective.get(), status));
        true
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: Headers<'_>,
        body: Option<&[u8]>,
        timeout_ms: u64,
    ) -> Option<u32> {
        if self.refuse_calls.get() {
            return None;
        }
        let token = self.next_token.get() + 1;
        self.next_token.set(token);
        self.sent.borrow_mut().push(Sent {
            token,
            cluster: cluster.to_owned(),
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            body: body.map(<[u8]>::to_vec),
            timeout_ms,
        });
        Some(token)
    }

    fn now_nanos(&self) -> u64 {
        self.now_ms.get() * 1_000_000
    }

    fn define_metric(&self, kind: MetricType, name: &str) -> Option<u32> {
        let mut m = self.metrics.borrow_mut();
        let next = m.len() as u32 + 1;
        Some(m.entry(name.to_owned()).or_insert((kind, next, 0)).1)
    }

    fn increment_metric(&self, id: u32, by: u64) {
        if let Some(m) = self.metrics.borrow_mut().values_mut().find(|(_, i, _)| *i == id) {
            m.2 += by;
        }
    }

    fn record_metric(&self, id: u32, value: u64) {
        if let Some(m) = self.metrics.borrow_mut().values_mut().find(|(_, i, _)| *i == id) {
            m.2 = value;
        }
    }

    fn set_tick(&self, ms: u64) -> bool {
        self.tick_ms.set(Some(ms));
        true
    }

    fn set_effective_context(&self, id: u32) -> bool {
        self.effective.set(id);
        true
    }

    fn resume_request(&self) -> bool {
        self.resumed.borrow_mut().push(self.effective.get());
        true
    }

    fn register_queue(&self, name: &str) -> Option<u32> {
        let mut q = self.queues.borrow_mut();
        let at = match q.iter().position(|(n, _)| n == name) {
            Some(at) => at,
            None => {
                q.push((name.to_owned(), Default::default()));
                q.len() - 1
            }
        };
        Some(at as u32 + 1)
    }

    fn resolve_queue(&self, vm_id: &str, name: &str) -> Option<u32> {
        let q = self.queues.borrow();
        let at = q.iter().position(|(n, _)| n == name).filter(|_| vm_id == FAKE_VM_ID)?;
        Some(at as u32 + 1)
    }

    fn enqueue(&self, queue: u32, value: &[u8]) -> bool {
        let mut q = self.queues.borrow_mut();
        let Some((_, messages)) = q.get_mut((queue as usize).wrapping_sub(1)) else { return false };
        messages.push_back(value.to_vec());
        true
    }

    fn dequeue(&self, queue: u32) -> Option<Bytes> {
        self.queues.borrow_mut().get_mut((queue as usize).wrapping_sub(1))?.1.pop_front()
    }
}
