//! Controllers and the names `--controllers` selects them by.
