//! End-to-end tests against a real container engine live in `tests/tests/`.
