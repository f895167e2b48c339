"""Tools around the library (benchmark, profiling, reports, data throughput and caching); not on the train path."""
