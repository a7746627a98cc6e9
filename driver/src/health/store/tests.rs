//! Unit tests of the `store` module.
