//! The GPU DRA kubelet plugin library.
