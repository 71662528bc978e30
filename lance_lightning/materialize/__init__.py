"""Local copies of a source: materialized views (a shuffled or filtered copy, written once and read in
order: `view`, `copy`, `integrity`, `space`) and the remote cache (a split read by take from an
object store, copied once to local disk and shuffled from there: `cache`)."""
