//! Library code run in this process against a stand-in server (the API test
//! server): what needs a server is tested here, not among the library's unit
//! tests, which `make unit` runs with no server allowed (`AWS_CCM_NO_SERVERS`).
//! The real binary against the servers is `tests/ccm/`.

mod admission;
mod events;
mod node_ipam;
mod server;
mod target_record;
