//! Unit tests of the `taints` module.
