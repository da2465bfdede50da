//! Service controller and Classic ELB end to end (being built).
