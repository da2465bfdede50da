//! Instances: lookups and tags the node controllers need (being built).
