# common/: errors (header only).
