"""Model architectures (conf/model/). Each family lives in its own module; import them directly."""
