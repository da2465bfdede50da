#!/usr/bin/env python3
"""check-owners.py tells an owner of state from a value and a context."""

import importlib.util
import pathlib
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("check_owners", HERE / "check-owners.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

SOURCE = """
pub(crate) struct Cache {
    pub(crate) ttl: Duration,
    entries: Arc<Mutex<HashMap<String, String>>>,
}
pub struct Health {
    pub ready: Arc<AtomicBool>,
}
struct Hidden {
    state: parking_lot::Mutex<u32>,
}
pub(crate) struct Plan {
    pub(crate) steps: Vec<String>,
}
pub(crate) struct Context<'a> {
    pub(crate) is_nlb: bool,
    notes: &'a RefCell<Vec<String>>,
}
pub(super) struct Metrics {
    pub(super) usage: Family<Labels, Gauge<f64, AtomicU64>>,
}
mod inner {
    pub(crate) struct Lazy {
        pub(crate) once: std::sync::OnceLock<u8>,
    }
}
"""

with tempfile.TemporaryDirectory() as d:
    path = pathlib.Path(d) / "sample.rs"
    path.write_text(SOURCE)
    found = [(name, owning, visible) for _, name, owning, visible in check.owners(path)]
assert found == [
    ("Cache", ["entries"], ["ttl"]),
    ("Health", ["ready"], ["ready"]),
    ("Lazy", ["once"], ["once"]),
], found
print("test_check_owners: ok")
