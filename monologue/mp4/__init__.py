"""Our MP4 boxes without a media stack (standard library only): building and walking boxes (`boxes`), reading the
fMP4 the node writes back into tracks and samples (`fragments`), and remuxing a stored fragmented MP4 into a
progressive one with its index first (`progressive`). Shared by the node (`gpu_worker/publish/`) and the API,
which has no PyAV."""
