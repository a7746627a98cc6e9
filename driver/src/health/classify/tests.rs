//! Unit tests of the `classify` module.
