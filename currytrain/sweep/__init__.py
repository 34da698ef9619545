"""The sweep group (conf/sweep/). Only `none` exists so far; later issues add the real options."""
