//! Node controllers end to end (being built).
