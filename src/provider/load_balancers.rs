//! Load balancers: what the service controller needs from the cloud (being built).
