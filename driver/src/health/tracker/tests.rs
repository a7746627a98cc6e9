//! Unit tests of the `tracker` module.
