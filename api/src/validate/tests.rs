//! Unit tests of the validator.
