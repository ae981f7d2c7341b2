// Package pending models what a consumer group handed out and has not had
// acked: contiguous offset ranges of one partition, each with a bitmap of its
// settled records, so handing out N records is one range and acking a batch
// touches one range instead of N rows. It is pure logic; the store persists
// ranges and the group package decides what happens to them.
package pending

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// Range is a run of offsets of one partition a group handed out together.
// Offsets of the run without a record (none in our topics, but retention can
// remove records) and records acked or moved to another range are settled.
type Range struct {
	// ID is the stored row's id; zero for a range not stored yet.
	ID        int64
	GroupID   int64
	Partition int32
	// First and Last are the range's first and last offsets, inclusive.
	First, Last int64
	// Settled holds one bit per offset: bit i of byte i/8 for First+i.
	Settled []byte
	// Stamps are the append times (ms) of the range's records, one per
	// offset, so pending entries can be listed with their ids without
	// reading the log.
	Stamps []int64
	// Unsettled is how many offsets are not settled.
	Unsettled   int
	Consumer    string
	Deliveries  int
	DeliveredAt time.Time
	RedeliverAt time.Time
	LastError   string
}

// New returns an unsettled range over offsets, which must be ascending; the
// offsets between them that are missing are settled. stamps[i] is the append
// time of offsets[i].
func New(groupID int64, partition int32, offsets, stamps []int64) Range {
	first, last := offsets[0], offsets[len(offsets)-1]
	n := int(last - first + 1)
	r := Range{
		GroupID: groupID, Partition: partition, First: first, Last: last,
		Settled: make([]byte, (n+7)/8), Stamps: make([]int64, n), Unsettled: len(offsets),
	}
	j := 0
	for i := range n {
		off := first + int64(i)
		if j < len(offsets) && offsets[j] == off {
			r.Stamps[i] = stamps[j]
			j++
			continue
		}
		r.Stamps[i] = r.Stamps[max(i-1, 0)]
		r.Settled[i/8] |= 1 << (i % 8)
	}
	return r
}

// Len is the number of offsets the range spans.
func (r *Range) Len() int { return int(r.Last - r.First + 1) }

// Contains reports whether off is within the range.
func (r *Range) Contains(off int64) bool { return off >= r.First && off <= r.Last }

// IsSettled reports whether off (within the range) is settled.
func (r *Range) IsSettled(off int64) bool {
	i := off - r.First
	return r.Settled[i/8]&(1<<(i%8)) != 0
}

// Settle marks off (within the range) settled and reports whether it was
// unsettled before.
func (r *Range) Settle(off int64) bool {
	if r.IsSettled(off) {
		return false
	}
	i := off - r.First
	r.Settled[i/8] |= 1 << (i % 8)
	r.Unsettled--
	return true
}

// Stamp is the append time (ms) of the record at off.
func (r *Range) Stamp(off int64) int64 { return r.Stamps[off-r.First] }

// Open returns the unsettled offsets, ascending.
func (r *Range) Open() []int64 {
	out := make([]int64, 0, r.Unsettled)
	for i, b := range r.Settled {
		for free := ^b; free != 0; free &= free - 1 {
			bit := bits.TrailingZeros8(free)
			off := r.First + int64(i*8+bit)
			if off > r.Last {
				break
			}
			out = append(out, off)
		}
	}
	return out
}

// Piece is a part of a range after Split: the offsets of one owner.
type Piece struct {
	Owner int
	Range Range
}

// Split cuts the range into pieces by owner: owner is called for each
// unsettled offset, and every maximal run of offsets with one owner becomes a
// piece (settled offsets stay with the run they fall in, and those before the
// first or after the last unsettled offset are dropped). Pieces keep the
// range's attributes and have no ID; the caller sets each owner's. A range
// with nothing unsettled yields no pieces.
func (r *Range) Split(owner func(off int64) int) []Piece {
	var (
		pieces []Piece
		cur    = -1 // index in pieces of the open piece
		start  int64
		end    int64 // last unsettled offset of the open piece
		count  int
	)
	closePiece := func() {
		if cur < 0 {
			return
		}
		pieces[cur].Range = r.slice(start, end, count)
		cur = -1
	}
	for _, off := range r.Open() {
		o := owner(off)
		if cur >= 0 && pieces[cur].Owner == o {
			end = off
			count++
			continue
		}
		closePiece()
		pieces = append(pieces, Piece{Owner: o})
		cur, start, end, count = len(pieces)-1, off, off, 1
	}
	closePiece()
	return pieces
}

// slice copies the offsets first..last (with unsettled of them unsettled)
// into a new range with r's attributes.
func (r *Range) slice(first, last int64, unsettled int) Range {
	n := int(last - first + 1)
	out := *r
	out.ID = 0
	out.First, out.Last, out.Unsettled = first, last, unsettled
	out.Stamps = append([]int64(nil), r.Stamps[first-r.First:last-r.First+1]...)
	out.Settled = make([]byte, (n+7)/8)
	for i := range n {
		if r.IsSettled(first + int64(i)) {
			out.Settled[i/8] |= 1 << (i % 8)
		}
	}
	return out
}

// EncodeStamps packs append times compactly: the first as a varint, then
// zig-zag varint differences, which are mostly zero or small because a
// partition's times barely move between neighbouring records.
func EncodeStamps(stamps []int64) []byte {
	out := make([]byte, 0, len(stamps)+8)
	prev := int64(0)
	for _, s := range stamps {
		out = binary.AppendVarint(out, s-prev)
		prev = s
	}
	return out
}

// DecodeStamps unpacks n append times written by EncodeStamps.
func DecodeStamps(b []byte, n int) ([]int64, error) {
	out := make([]int64, n)
	prev := int64(0)
	for i := range n {
		d, k := binary.Varint(b)
		if k <= 0 {
			return nil, errors.New("decode stamps: truncated")
		}
		prev += d
		out[i] = prev
		b = b[k:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("decode stamps: %d trailing bytes", len(b))
	}
	return out, nil
}
