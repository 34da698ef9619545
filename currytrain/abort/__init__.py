"""The abort group (conf/abort/). Only `none` exists so far; later issues add the real options."""
