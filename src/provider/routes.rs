//! Routes: route tables and routes the route controller needs (being built).
