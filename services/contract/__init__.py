"""The contract between the router and its workers, and the profiler's vocabulary the router shares.

Both sides import this package and nothing of each other: `calls` holds the steps the router sends and the
results a worker returns, `errors` what a call can fail with and the gRPC status each failure travels as,
`wire` the protobuf forms of both, `measures` the profiler's modes and buckets the scheduler keys its
figures by. Nothing here imports torch: the router forwards a level's distribution rows to the next level
as it received them, without decoding them.
"""
