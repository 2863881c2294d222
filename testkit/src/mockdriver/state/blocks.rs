//! What volumes and snapshots hold, block by block, and what the SnapshotMetadata service lists
//! of them. Content is modelled, not stored: every written 4 KiB block carries the number of
//! the write that last changed it, and blocks are kept as ranges, so a filled 4 GiB volume
//! (1 Mi blocks) is one entry, and listing it costs no more than producing its tuples.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use tonic::Code;

use super::{ContentSource, Rejection, Snapshot, State, reject, require};

/// Size of a block, and of every tuple listed (FIXED_LENGTH), as hostpath's.
pub const BLOCK_SIZE: i64 = 4096;

/// Tuples per message when a request's `max_results` is 0 (hostpath's choice).
pub const DEFAULT_MAX_RESULTS: usize = 256;

/// How many blocks a volume of `capacity_bytes` has (a partial last block counts).
pub fn block_count(capacity_bytes: i64) -> u64 {
    u64::try_from(capacity_bytes)
        .unwrap_or(0)
        .div_ceil(BLOCK_SIZE.unsigned_abs())
}

/// A run of blocks whose content one write produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Extent {
    end: u64,
    write: u64,
}

/// The written blocks of a volume or snapshot: block index ranges, each with the number of the
/// write that produced its content. Blocks never written read as zeros: not allocated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocks {
    /// First block of each extent → the extent; extents are disjoint.
    extents: BTreeMap<u64, Extent>,
}

impl Blocks {
    /// Gives `blocks` the content of write number `write`.
    pub fn write(&mut self, blocks: Range<u64>, write: u64) {
        if blocks.is_empty() {
            return;
        }
        // An extent reaching into the range from before it keeps its head, and its tail if it
        // reaches past the range.
        if let Some((&start, &extent)) = self.extents.range(..blocks.start).next_back()
            && extent.end > blocks.start
        {
            self.extents.insert(
                start,
                Extent {
                    end: blocks.start,
                    ..extent
                },
            );
            if extent.end > blocks.end {
                self.extents.insert(blocks.end, extent);
            }
        }
        // Extents starting inside the range are overwritten; the last may keep its tail.
        let inside: Vec<u64> = self
            .extents
            .range(blocks.clone())
            .map(|(&s, _)| s)
            .collect();
        for start in inside {
            if let Some(extent) = self.extents.remove(&start)
                && extent.end > blocks.end
            {
                self.extents.insert(blocks.end, extent);
            }
        }
        self.extents.insert(
            blocks.start,
            Extent {
                end: blocks.end,
                write,
            },
        );
    }

    /// How many blocks are written.
    pub fn len(&self) -> u64 {
        self.extents.iter().map(|(start, e)| e.end - start).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    /// The written blocks as ascending, disjoint ranges, adjacent ones merged.
    pub fn ranges(&self) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        for (&start, extent) in &self.extents {
            push_merged(&mut out, start..extent.end);
        }
        out
    }

    /// The blocks whose content differs from `base`'s: written in one and not the other, or by
    /// different writes. Ascending, disjoint, adjacent ones merged.
    pub fn changed_since(&self, base: &Blocks) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut ours = self.extents.iter().peekable();
        let mut theirs = base.extents.iter().peekable();
        let mut pos = 0;
        loop {
            while ours.next_if(|(_, e)| e.end <= pos).is_some() {}
            while theirs.next_if(|(_, e)| e.end <= pos).is_some() {}
            let (a, b) = (ours.peek(), theirs.peek());
            if a.is_none() && b.is_none() {
                return out;
            }
            // What each side holds at `pos` (the write, or none) and up to where it holds it.
            let at = |side: Option<&(&u64, &Extent)>| match side {
                Some(&(&start, e)) if start <= pos => (Some(e.write), e.end),
                Some(&(&start, _)) => (None, start),
                None => (None, u64::MAX),
            };
            let ((write_a, end_a), (write_b, end_b)) = (at(a), at(b));
            let next = end_a.min(end_b);
            if write_a != write_b {
                push_merged(&mut out, pos..next);
            }
            pos = next;
        }
    }
}

fn push_merged(out: &mut Vec<Range<u64>>, range: Range<u64>) {
    match out.last_mut() {
        Some(last) if last.end == range.start => last.end = range.end,
        _ => out.push(range),
    }
}

/// Sorted block indices as runs of consecutive blocks.
fn runs(mut indices: Vec<u64>) -> Vec<Range<u64>> {
    indices.sort_unstable();
    indices.dedup();
    let mut out = Vec::new();
    for index in indices {
        push_merged(&mut out, index..index.saturating_add(1));
    }
    out
}

/// One tuple of a listing (CSI `BlockMetadata`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub byte_offset: i64,
    pub size_bytes: i64,
}

impl ByteRange {
    /// Block number `index` as a FIXED_LENGTH tuple.
    pub fn block(index: u64) -> Self {
        Self {
            byte_offset: i64::try_from(index)
                .unwrap_or(i64::MAX)
                .saturating_mul(BLOCK_SIZE),
            size_bytes: BLOCK_SIZE,
        }
    }

    pub fn end(&self) -> i64 {
        self.byte_offset.saturating_add(self.size_bytes)
    }
}

/// What one GetMetadataAllocated or GetMetadataDelta call lists: one FIXED_LENGTH tuple per
/// block of `ranges`, ascending, at most `max_results` a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockListing {
    /// The snapshot's size (the target's, for a delta).
    pub volume_capacity_bytes: i64,
    /// Block ranges, ascending and disjoint, from the block holding `starting_offset` on and
    /// within the capacity.
    pub ranges: Vec<Range<u64>>,
    /// Tuples per message (the request's `max_results`, 0 meaning [`DEFAULT_MAX_RESULTS`]).
    pub max_results: usize,
    /// The request's, not negative.
    pub starting_offset: i64,
}

impl BlockListing {
    fn new(
        capacity_bytes: i64,
        ranges: Vec<Range<u64>>,
        starting_offset: i64,
        max_results: i32,
    ) -> Result<Self, Rejection> {
        // hostpath's seek fails on a negative offset.
        let Ok(start) = u64::try_from(starting_offset) else {
            return reject(
                Code::OutOfRange,
                format!("starting_offset {starting_offset} is negative"),
            );
        };
        let Ok(max_results) = usize::try_from(max_results) else {
            return reject(
                Code::InvalidArgument,
                format!("max_results {max_results} is negative"),
            );
        };
        let first = start / BLOCK_SIZE.unsigned_abs();
        let end = block_count(capacity_bytes);
        let ranges = ranges
            .into_iter()
            .map(|r| r.start.max(first)..r.end.min(end))
            .filter(|r| !r.is_empty())
            .collect();
        Ok(Self {
            volume_capacity_bytes: capacity_bytes,
            ranges,
            max_results: if max_results == 0 {
                DEFAULT_MAX_RESULTS
            } else {
                max_results
            },
            starting_offset,
        })
    }

    /// How many tuples the listing holds.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The tuples, ascending (`.rev()` for descending), produced as they are consumed.
    pub fn tuples(&self) -> impl DoubleEndedIterator<Item = ByteRange> + Send + 'static {
        self.ranges
            .clone()
            .into_iter()
            .flatten()
            .map(ByteRange::block)
    }

    /// The tuples in messages of `max_results`, as a well-behaved driver sends them.
    pub fn messages(&self) -> Batches<impl Iterator<Item = ByteRange> + Send + 'static> {
        Batches::new(self.tuples(), self.max_results)
    }
}

/// Groups items into batches of at most `size` (at least one); never yields an empty batch.
#[derive(Clone, Debug)]
pub struct Batches<I> {
    items: I,
    size: usize,
}

impl<I> Batches<I> {
    pub fn new(items: I, size: usize) -> Self {
        Self {
            items,
            size: size.max(1),
        }
    }
}

impl<I: Iterator> Iterator for Batches<I> {
    type Item = Vec<I::Item>;

    fn next(&mut self) -> Option<Self::Item> {
        let batch: Vec<I::Item> = self.items.by_ref().take(self.size).collect();
        (!batch.is_empty()).then_some(batch)
    }
}

impl State {
    /// Gives the blocks `blocks` (4 KiB block indices, any order) of volume `volume_id` new
    /// content: snapshots cut before differ there from those cut after. OUT_OF_RANGE for a
    /// block past the volume's end.
    pub fn write_blocks(
        &mut self,
        volume_id: &str,
        blocks: impl IntoIterator<Item = u64>,
    ) -> Result<(), Rejection> {
        self.write_runs(volume_id, runs(blocks.into_iter().collect()))
    }

    /// [`write_blocks`](Self::write_blocks) of a range of blocks, without listing them.
    pub fn write_range(&mut self, volume_id: &str, blocks: Range<u64>) -> Result<(), Rejection> {
        self.write_runs(volume_id, [blocks])
    }

    /// Writes every block of volume `volume_id`: all of it is allocated.
    pub fn fill(&mut self, volume_id: &str) -> Result<(), Rejection> {
        require(volume_id, "volume_id")?;
        let count = block_count(self.volume(volume_id)?.capacity_bytes);
        self.write_range(volume_id, 0..count)
    }

    fn write_runs(
        &mut self,
        volume_id: &str,
        runs: impl IntoIterator<Item = Range<u64>>,
    ) -> Result<(), Rejection> {
        let runs: Vec<Range<u64>> = runs.into_iter().collect();
        require(volume_id, "volume_id")?;
        let count = block_count(self.volume(volume_id)?.capacity_bytes);
        if let Some(end) = runs.iter().map(|r| r.end).max()
            && end > count
        {
            return reject(
                Code::OutOfRange,
                format!(
                    "block {} is past the end of volume {volume_id} ({count} blocks)",
                    end - 1
                ),
            );
        }
        // One write number per call: its blocks all get new content, and content that
        // differs from every earlier write's.
        self.last_write += 1;
        let write = self.last_write;
        let blocks = self.volume_blocks.entry(volume_id.to_owned()).or_default();
        for run in runs {
            blocks.write(run, write);
        }
        Ok(())
    }

    /// A new snapshot holds what its volume holds when it is cut.
    pub(super) fn cut_blocks(&mut self, volume_id: &str, snapshot_id: &str) {
        if let Some(blocks) = self.volume_blocks.get(volume_id).cloned() {
            self.snapshot_blocks.insert(snapshot_id.to_owned(), blocks);
        }
    }

    /// A new volume holds what its source holds.
    pub(super) fn restore_blocks(&mut self, source: &ContentSource, volume_id: &str) {
        let blocks = match source {
            ContentSource::Snapshot(id) => self.snapshot_blocks.get(id),
            ContentSource::Volume(id) => self.volume_blocks.get(id),
        };
        if let Some(blocks) = blocks.cloned() {
            self.volume_blocks.insert(volume_id.to_owned(), blocks);
        }
    }

    /// A snapshot for a SnapshotMetadata call: NOT_FOUND if missing, UNAVAILABLE if not ready
    /// (as the mock reports readiness, see `MockConfig::snapshot_ready_after`).
    fn listed_snapshot(
        &self,
        id: &str,
        role: &str,
        ready_after: u32,
    ) -> Result<&Snapshot, Rejection> {
        let snapshot = self.snapshots.get(id).ok_or_else(|| {
            Rejection::new(Code::NotFound, format!("cannot find the {role} {id}"))
        })?;
        if snapshot.answers <= ready_after {
            return reject(
                Code::Unavailable,
                format!("the {role} {id} is not ready yet"),
            );
        }
        Ok(snapshot)
    }

    /// GetMetadataAllocated: the written blocks of snapshot `snapshot_id`.
    pub fn metadata_allocated(
        &self,
        snapshot_id: &str,
        starting_offset: i64,
        max_results: i32,
        ready_after: u32,
    ) -> Result<BlockListing, Rejection> {
        require(snapshot_id, "snapshot_id")?;
        let snapshot = self.listed_snapshot(snapshot_id, "snapshot", ready_after)?;
        let ranges = self
            .snapshot_blocks
            .get(snapshot_id)
            .map(Blocks::ranges)
            .unwrap_or_default();
        BlockListing::new(snapshot.size_bytes, ranges, starting_offset, max_results)
    }

    /// GetMetadataDelta: the blocks whose content differs between two snapshots of one volume.
    pub fn metadata_delta(
        &self,
        base_snapshot_id: &str,
        target_snapshot_id: &str,
        starting_offset: i64,
        max_results: i32,
        ready_after: u32,
    ) -> Result<BlockListing, Rejection> {
        require(base_snapshot_id, "base_snapshot_id")?;
        require(target_snapshot_id, "target_snapshot_id")?;
        let base = self.listed_snapshot(base_snapshot_id, "base snapshot", ready_after)?;
        let target = self.listed_snapshot(target_snapshot_id, "target snapshot", ready_after)?;
        if base.source_volume_id != target.source_volume_id {
            // hostpath's words.
            return reject(
                Code::InvalidArgument,
                "snapshots don't belong to the same Volume",
            );
        }
        let none = Blocks::default();
        let blocks = |id: &str| self.snapshot_blocks.get(id).unwrap_or(&none);
        let ranges = blocks(target_snapshot_id).changed_since(blocks(base_snapshot_id));
        BlockListing::new(target.size_bytes, ranges, starting_offset, max_results)
    }
}

#[cfg(test)]
// Lists of block ranges are what is tested here.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use crate::mockdriver::config::MockConfig;
    use crate::mockdriver::state::{AccessMode, AccessType, Capability, VolumeRequest};

    const MIB: i64 = 1 << 20;

    fn blocks(writes: &[(Range<u64>, u64)]) -> Blocks {
        let mut b = Blocks::default();
        for (range, write) in writes {
            b.write(range.clone(), *write);
        }
        b
    }

    fn block_volume(name: &str, size: i64, source: Option<ContentSource>) -> VolumeRequest {
        VolumeRequest {
            name: name.into(),
            required_bytes: size,
            capabilities: vec![Capability {
                access_mode: AccessMode::SingleNodeWriter,
                access_type: AccessType::Block,
            }],
            content_source: source,
            ..VolumeRequest::default()
        }
    }

    fn create(state: &mut State, request: VolumeRequest) -> String {
        let config = MockConfig::default();
        state.create_volume(&config, request).unwrap().id
    }

    /// A state with one volume of `size` bytes, and its id.
    fn state_with_volume(size: i64) -> (State, String) {
        let mut state = State::default();
        let id = create(&mut state, block_volume("pvc", size, None));
        (state, id)
    }

    fn snapshot(state: &mut State, name: &str, volume: &str) -> String {
        state.create_snapshot(name, volume, (1, 0)).unwrap().id
    }

    /// The tuples of a listing's messages as block numbers.
    fn listed(listing: &BlockListing) -> Vec<Vec<i64>> {
        listing
            .messages()
            .map(|m| m.iter().map(|t| t.byte_offset / BLOCK_SIZE).collect())
            .collect()
    }

    #[test]
    fn writes_split_and_replace_extents() {
        let mut b = blocks(&[(0..10, 1)]);
        b.write(3..5, 2);
        assert_eq!(b.ranges(), [0..10]);
        assert_eq!(b.len(), 10);
        // Only blocks 3 and 4 differ from the first write.
        assert_eq!(b.changed_since(&blocks(&[(0..10, 1)])), [3..5]);
        // Overwriting across extent boundaries keeps the outer parts.
        b.write(4..8, 3);
        assert_eq!(b.changed_since(&blocks(&[(0..10, 1)])), [3..8]);
        b.write(20..22, 4);
        assert_eq!(b.ranges(), [0..10, 20..22]);
        b.write(0..30, 5);
        assert_eq!(b.ranges(), [0..30]);
        assert_eq!(b.changed_since(&b.clone()), Vec::<Range<u64>>::new());
        b.write(7..7, 6);
        assert_eq!(b.len(), 30, "an empty range writes nothing");
    }

    #[test]
    fn changes_include_blocks_written_on_one_side_only() {
        let base = blocks(&[(2..4, 1), (10..12, 2)]);
        let target = blocks(&[(2..4, 1), (5..6, 3), (11..13, 4)]);
        assert_eq!(target.changed_since(&base), [5..6, 10..13]);
        assert_eq!(base.changed_since(&target), [5..6, 10..13]);
        assert_eq!(base.changed_since(&Blocks::default()), [2..4, 10..12]);
    }

    #[test]
    fn snapshots_keep_what_their_volume_held() {
        // hostpath's lab case: 1 MiB volume, blocks 1, 3, 4 written, snap1, blocks 3 and 10
        // rewritten, snap2.
        let (mut state, vol) = state_with_volume(MIB);
        state.write_blocks(&vol, [4, 1, 3, 3]).unwrap();
        let snap1 = snapshot(&mut state, "snap1", &vol);
        state.write_blocks(&vol, [3, 10]).unwrap();
        let snap2 = snapshot(&mut state, "snap2", &vol);

        let allocated = state.metadata_allocated(&snap1, 0, 2, 0).unwrap();
        assert_eq!(allocated.volume_capacity_bytes, MIB);
        assert_eq!(listed(&allocated), [vec![1, 3], vec![4]]);
        let allocated = state.metadata_allocated(&snap2, 0, 0, 0).unwrap();
        assert_eq!(listed(&allocated), [vec![1, 3, 4, 10]]);
        let delta = state.metadata_delta(&snap1, &snap2, 0, 0, 0).unwrap();
        assert_eq!(listed(&delta), [vec![3, 10]]);
        assert_eq!(
            delta.messages().next().unwrap()[1],
            ByteRange {
                byte_offset: 40960,
                size_bytes: 4096
            }
        );

        // A volume restored from snap1 holds what snap1 holds, and writes go to it alone.
        let source = ContentSource::Snapshot(snap1.clone());
        let restored = create(&mut state, block_volume("restored", MIB, Some(source)));
        assert_eq!(state.volume_blocks[&restored].ranges(), [1..2, 3..5]);
        state.fill(&restored).unwrap();
        assert_eq!(state.metadata_allocated(&snap1, 0, 0, 0).unwrap().len(), 3);
        // Deleting forgets the blocks.
        state.delete_snapshot(&snap1).unwrap();
        assert!(!state.snapshot_blocks.contains_key(&snap1));
        state.delete_volume(&restored).unwrap();
        assert!(!state.volume_blocks.contains_key(&restored));
    }

    #[test]
    fn listings_start_at_the_block_holding_the_offset() {
        let (mut state, vol) = state_with_volume(MIB);
        state.write_blocks(&vol, [1, 3, 4, 200]).unwrap();
        let snap = snapshot(&mut state, "snap", &vol);
        let from = |offset| listed(&state.metadata_allocated(&snap, offset, 0, 0).unwrap());
        assert_eq!(from(3 * BLOCK_SIZE), [vec![3, 4, 200]]);
        // An unaligned offset lists the block it falls in.
        assert_eq!(from(3 * BLOCK_SIZE + 1), [vec![3, 4, 200]]);
        assert_eq!(from(4 * BLOCK_SIZE + 4095), [vec![4, 200]]);
        // Past the end: nothing, and no message.
        assert!(from(MIB).is_empty());
        assert!(from(i64::MAX).is_empty());
        let negative = state.metadata_allocated(&snap, -1, 0, 0).unwrap_err();
        assert_eq!(negative.code, Code::OutOfRange);
        let negative = state.metadata_allocated(&snap, 0, -1, 0).unwrap_err();
        assert_eq!(negative.code, Code::InvalidArgument);
    }

    #[test]
    fn max_results_bounds_every_message() {
        let (mut state, vol) = state_with_volume(8 * MIB);
        state.write_range(&vol, 0..1000).unwrap();
        let snap = snapshot(&mut state, "snap", &vol);
        let sizes = |max| -> Vec<usize> {
            state
                .metadata_allocated(&snap, 0, max, 0)
                .unwrap()
                .messages()
                .map(|m| m.len())
                .collect()
        };
        // 0 lets the driver choose: 256, as hostpath.
        assert_eq!(sizes(0), [256, 256, 256, 232]);
        assert_eq!(sizes(300), [300, 300, 300, 100]);
        assert_eq!(sizes(1000), [1000]);
        assert_eq!(sizes(5000), [1000]);
        assert_eq!(sizes(1).len(), 1000);
    }

    #[test]
    fn delta_needs_two_snapshots_of_one_volume() {
        let (mut state, vol) = state_with_volume(MIB);
        let other_vol = create(&mut state, block_volume("other", MIB, None));
        let a = snapshot(&mut state, "a", &vol);
        let b = snapshot(&mut state, "b", &other_vol);
        let code = |r: Result<BlockListing, Rejection>| r.unwrap_err().code;
        let across = state.metadata_delta(&a, &b, 0, 0, 0).unwrap_err();
        assert_eq!(
            (across.code, across.message.as_str()),
            (
                Code::InvalidArgument,
                "snapshots don't belong to the same Volume"
            )
        );
        assert_eq!(
            code(state.metadata_delta("nope", &a, 0, 0, 0)),
            Code::NotFound
        );
        assert_eq!(
            code(state.metadata_delta(&a, "nope", 0, 0, 0)),
            Code::NotFound
        );
        assert_eq!(
            code(state.metadata_delta("", &a, 0, 0, 0)),
            Code::InvalidArgument
        );
        assert_eq!(
            code(state.metadata_allocated("nope", 0, 0, 0)),
            Code::NotFound
        );
        assert_eq!(
            code(state.metadata_delta(&a, &a, -4096, 0, 0)),
            Code::OutOfRange
        );
        // Nothing written between two snapshots: nothing changed.
        let a2 = snapshot(&mut state, "a2", &vol);
        assert!(state.metadata_delta(&a, &a2, 0, 0, 0).unwrap().is_empty());
        // A snapshot not ready yet (the mock's readiness) is UNAVAILABLE.
        assert_eq!(
            code(state.metadata_allocated(&a, 0, 0, 1)),
            Code::Unavailable
        );
    }

    #[test]
    fn writes_past_the_end_are_refused() {
        let (mut state, vol) = state_with_volume(MIB);
        let past = state.write_blocks(&vol, [256]).unwrap_err();
        assert_eq!(past.code, Code::OutOfRange);
        assert_eq!(
            state.write_blocks("nope", [0]).unwrap_err().code,
            Code::NotFound
        );
        assert!(!state.volume_blocks.contains_key(&vol), "nothing written");
        state.write_blocks(&vol, [255]).unwrap();
        assert_eq!(state.volume_blocks[&vol].ranges(), [255..256]);
    }

    #[test]
    fn a_filled_4_gib_volume_is_cheap() {
        const GIB: i64 = 1 << 30;
        let (mut state, vol) = state_with_volume(4 * GIB);
        state.fill(&vol).unwrap();
        let base = snapshot(&mut state, "base", &vol);
        state.fill(&vol).unwrap();
        let target = snapshot(&mut state, "target", &vol);
        // One extent each, however many blocks.
        assert_eq!(state.snapshot_blocks[&target].ranges(), [0..(1 << 20)]);
        assert_eq!(state.snapshot_blocks[&target].len(), 1 << 20);
        let listing = state.metadata_delta(&base, &target, 0, 0, 0).unwrap();
        assert_eq!(listing.len(), 1 << 20);
        let mut messages = 0;
        let mut tuples = 0;
        let mut last_end = 0;
        for message in listing.messages() {
            messages += 1;
            tuples += message.len();
            assert!(message.len() <= DEFAULT_MAX_RESULTS);
            assert_eq!(message[0].byte_offset, last_end, "ascending, no gaps");
            last_end = message[message.len() - 1].end();
        }
        assert_eq!((messages, tuples, last_end), (4096, 1 << 20, 4 * GIB));
        // The state file holds a line per volume, not per block.
        let json = serde_json::to_string(&state).unwrap();
        assert!(json.len() < 4096, "{}", json.len());
        let back: State = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
    }
}
