"""The check group (conf/check/). Only `none` exists so far; later issues add the real options."""
