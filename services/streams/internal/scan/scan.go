// Package scan reads a stream by id range or from its tail, merging its
// partitions in id order, and waits for records appended after the call
// without polling.
package scan

import (
	"context"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/wake"
	"github.com/razorbill/flo/services/streams/internal/catalog"
	"github.com/razorbill/flo/services/streams/internal/logread"
	"github.com/razorbill/flo/services/streams/internal/record"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// Limits of one read.
const (
	DefaultCount = 100
	MaxCount     = 10_000
	MaxBlock     = 10 * time.Minute
)

// Request is a range or tail read.
type Request struct {
	Namespace, Stream string
	// Start: "-" or empty, "$", "(ID" or ID; End: "+" or empty, or ID.
	Start, End string
	Count      int
	// Block is how long to wait for a record when the range has none yet
	// (only with an open end).
	Block time.Duration
	// Tail > 0 returns the last Tail records instead of a range.
	Tail int
}

// Result is what a read returned.
type Result struct {
	Records []record.Record
	// Next is the start to read on with: a cursor naming the offset to go
	// on from in each partition; empty when End was an id and the read
	// reached it.
	Next string
}

// Scanner reads streams.
type Scanner struct {
	catalog *catalog.Catalog
	reader  *logread.Reader
	hub     *wake.Hub
	closing <-chan struct{}
}

// New returns a Scanner. Blocked reads wake on the hub key of the stream's
// topic and return (empty) once closing is closed.
func New(cat *catalog.Catalog, reader *logread.Reader, hub *wake.Hub, closing <-chan struct{}) *Scanner {
	return &Scanner{catalog: cat, reader: reader, hub: hub, closing: closing}
}

// Read reads a stream.
func (s *Scanner) Read(ctx context.Context, req Request) (Result, error) {
	switch {
	case req.Count < 0:
		return Result{}, fault.Invalidf("count must not be negative, got %d", req.Count)
	case req.Count == 0:
		req.Count = DefaultCount
	}
	req.Count = min(req.Count, MaxCount)
	if req.Block < 0 {
		return Result{}, fault.Invalidf("block_ms must not be negative")
	}
	req.Block = min(req.Block, MaxBlock)
	if req.Tail < 0 {
		return Result{}, fault.Invalidf("tail must not be negative, got %d", req.Tail)
	}
	if req.Tail > 0 && (req.Start != "" || req.End != "") {
		return Result{}, fault.Invalidf("tail cannot be combined with start or end")
	}
	start, err := record.ParseStart("start", req.Start, true)
	if err != nil {
		return Result{}, err
	}
	end, err := record.ParseEnd("end", req.End)
	if err != nil {
		return Result{}, err
	}
	st, err := s.catalog.GetStream(ctx, req.Namespace, req.Stream)
	if err != nil {
		return Result{}, err
	}
	if req.Tail > 0 {
		return s.tail(ctx, st, min(req.Tail, MaxCount))
	}
	return s.rangeRead(ctx, st, start, end, req.Count, req.Block)
}

func (s *Scanner) rangeRead(ctx context.Context, st store.Stream, start record.Start, end record.End, count int, block time.Duration) (Result, error) {
	wait := block > 0 && end.Open
	var w *wake.Waiter
	if wait {
		// Subscribe before looking, so an append after the look wakes us.
		w = s.hub.Subscribe([]string{st.Topic()})
		defer s.hub.Unsubscribe(w)
	}
	froms, err := s.startOffsets(ctx, st, start)
	if err != nil {
		return Result{}, err
	}
	var (
		deadline <-chan time.Time
		release  func()
	)
	for {
		probed := wait && w.Probed()
		recs, pos, done, err := s.collect(ctx, st, froms, start, end, count)
		if err != nil {
			return Result{}, err
		}
		if probed && len(recs) > 0 {
			// The hub's safety probe found what the stream's other
			// waiters missed too.
			s.hub.Wake(st.Topic())
		}
		res := Result{Records: recs}
		if !done || end.Open {
			res.Next = record.Cursor(st.ID, pos)
		}
		if len(recs) > 0 || !wait {
			return res, nil
		}
		// Records before start that were passed over need not be
		// looked at again.
		froms = pos
		if release == nil {
			release = s.reader.Watch(st.Topic(), st.Partitions)
			defer release()
			t := time.NewTimer(block)
			defer t.Stop()
			deadline = t.C
		}
		// The hub's safety tick probes one waiter of the stream now and then.
		select {
		case <-w.C():
		case <-deadline:
			return res, nil
		case <-s.closing:
			return res, nil
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
}

// startOffsets is, per partition, the first offset a read from start looks at.
func (s *Scanner) startOffsets(ctx context.Context, st store.Stream, start record.Start) ([]int64, error) {
	switch start.Kind {
	case record.FromFirst:
		return s.reader.ListStarts(ctx, st.Topic(), st.Partitions)
	case record.FromNew:
		return s.reader.ListEnds(ctx, st.Topic(), st.Partitions)
	case record.AtCursor:
		if start.Stream != st.ID {
			return nil, fault.Invalidf("start: the cursor is from another stream (was %q deleted and created again?)", st.Name)
		}
		if len(start.Offsets) != int(st.Partitions) {
			return nil, fault.Invalidf("start: the cursor names %d partitions, stream %q has %d", len(start.Offsets), st.Name, st.Partitions)
		}
		return start.Offsets, nil
	}
	return s.catalog.OffsetsOf(ctx, st, start.ID)
}

// partitionCursor is one partition's place in a merge.
type partitionCursor struct {
	partition int32
	// next is the offset to fetch from; buf holds records fetched and
	// not yet merged.
	next int64
	buf  []*kgo.Record
	done bool
	// pos is where a read going on from this one starts: after the last
	// record merged or passed over as before the start.
	pos int64
}

// collect merges the partitions from froms in id order, keeping records
// within start and end, up to count. pos is, per partition, where a read
// going on from this one starts; done reports that every partition ran out
// (reached its end or passed End).
func (s *Scanner) collect(ctx context.Context, st store.Stream, froms []int64, start record.Start, end record.End, count int) (out []record.Record, pos []int64, done bool, err error) {
	cursors := make([]*partitionCursor, len(froms))
	for p, f := range froms {
		cursors[p] = &partitionCursor{partition: int32(p), next: f, pos: f}
	}
	positions := func() []int64 {
		pos := make([]int64, len(cursors))
		for p, c := range cursors {
			pos[p] = c.pos
		}
		return pos
	}
	budget := record.MaxResponseBytes
	for len(out) < count && budget > 0 {
		if err := s.refill(ctx, st.Topic(), cursors, start, end, count-len(out)); err != nil {
			return nil, nil, false, err
		}
		var best *partitionCursor
		var bestID record.ID
		for _, c := range cursors {
			if len(c.buf) == 0 {
				continue
			}
			id := record.IDOf(c.buf[0])
			if best == nil || id.Compare(bestID) < 0 {
				best, bestID = c, id
			}
		}
		if best == nil {
			return out, positions(), true, nil
		}
		out = append(out, record.FromLog(best.buf[0]))
		budget -= record.Size(best.buf[0])
		best.pos = best.buf[0].Offset + 1
		best.buf = best.buf[1:]
	}
	for _, c := range cursors {
		if len(c.buf) > 0 || !c.done {
			return out, positions(), false, nil
		}
	}
	return out, positions(), true, nil
}

// refill reads on for every partition whose buffer ran dry, until each has
// a record or is done.
func (s *Scanner) refill(ctx context.Context, topic string, cursors []*partitionCursor, start record.Start, end record.End, want int) error {
	for {
		var wants []logread.Want
		var idx []*partitionCursor
		for _, c := range cursors {
			if len(c.buf) == 0 && !c.done {
				wants = append(wants, logread.Want{Partition: c.partition, From: c.next, Max: want})
				idx = append(idx, c)
			}
		}
		if len(wants) == 0 {
			return nil
		}
		gots, err := s.reader.Read(ctx, topic, wants)
		if err != nil {
			return err
		}
		for i, g := range gots {
			c := idx[i]
			if len(g.Records) == 0 {
				// Retention may have removed records from pos on.
				c.pos = max(c.pos, g.From)
				c.done = true
				continue
			}
			c.next = g.Next
			for _, r := range g.Records {
				id := record.IDOf(r)
				if !end.Includes(id) {
					// Ids grow within a partition: nothing after this
					// is in range either.
					c.done = true
					break
				}
				switch {
				case start.Includes(id):
					c.buf = append(c.buf, r)
				case len(c.buf) == 0:
					c.pos = r.Offset + 1
				}
			}
		}
	}
}

// tail returns the last n records of the stream in id order.
func (s *Scanner) tail(ctx context.Context, st store.Stream, n int) (Result, error) {
	starts, err := s.reader.ListStarts(ctx, st.Topic(), st.Partitions)
	if err != nil {
		return Result{}, err
	}
	ends, err := s.reader.ListEnds(ctx, st.Topic(), st.Partitions)
	if err != nil {
		return Result{}, err
	}
	var all []record.Record
	for p := range st.Partitions {
		from := max(starts[p], ends[p]-int64(n))
		for from < ends[p] {
			gots, err := s.reader.Read(ctx, st.Topic(), []logread.Want{{Partition: p, From: from, Max: int(ends[p] - from)}})
			if err != nil {
				return Result{}, err
			}
			g := gots[0]
			if len(g.Records) == 0 {
				break
			}
			for _, r := range g.Records {
				if r.Offset < ends[p] {
					all = append(all, record.FromLog(r))
				}
			}
			from = g.Next
		}
	}
	slices.SortFunc(all, func(a, b record.Record) int { return a.ID.Compare(b.ID) })
	if len(all) > n {
		all = all[len(all)-n:]
	}
	// Keep the newest records that fit one response.
	budget := record.MaxResponseBytes
	for i := len(all) - 1; i >= 0; i-- {
		if budget <= 0 {
			all = all[i+1:]
			break
		}
		budget -= len(all[i].Payload) + len(all[i].Key) + 64
	}
	return Result{Records: all, Next: record.Cursor(st.ID, ends)}, nil
}
