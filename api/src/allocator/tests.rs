//! Unit tests of the allocator (see api/tests/allocator*.rs for the end-to-end ones).
