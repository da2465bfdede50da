//! Route controller and node IPAM end to end (being built).
