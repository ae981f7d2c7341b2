package workerstream

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"

	"github.com/razorbill/flo/libs/millis"
	"github.com/razorbill/flo/libs/text"
)

const (
	// maxSubscriptions caps the stream/group pairs one Hello may name, and
	// maxReads the reads outstanding for each pair, which bounds what a
	// session's reads hold. Several reads of a pair let a worker ask for its
	// next batch while the last is on its way.
	maxSubscriptions = 64
	maxReads         = 4
	// defaultGroup is the group of a subscription or message that names none.
	defaultGroup = "default"
	// maxReadCount is the protocol's cap on a StreamRead's count (larger
	// counts are capped, as the streams service caps them), and
	// defaultReadCount what a count of zero means.
	maxReadCount     = 10_000
	defaultReadCount = 10
	// readSlack is how much longer than its block time a GroupReadMany may
	// take before the gateway gives up on it.
	readSlack = 10 * time.Second
	// defaultMessageTimeout is the streams service's message timeout when a
	// read names none; a record sent to the worker counts as held this long.
	defaultMessageTimeout = 5 * time.Minute
	// maxMessageTimeout is the streams service's cap on a read's message
	// timeout, so a huge message_timeout_ms cannot overflow a deadline here.
	maxMessageTimeout = 24 * time.Hour
)

// subscription is one stream/group a worker consumes as consumer.
type subscription struct {
	stream, group, consumer string
	// reads are the worker's outstanding reads, guarded by the session's
	// readsMu.
	reads []*readCall
}

// readCall is one StreamRead as the group read it becomes. Its identity
// tells a read round that returns whether the read it serves is still
// waiting for its answer (it is never zero-sized, so distinct calls have distinct
// addresses).
type readCall struct {
	req   *flov1.GroupReadRequest
	block time.Duration
	// queued is the read in its hub, guarded by the Server's readHubs.mu.
	queued *hubRead
}

// delivery names the records of one RecordBatch, so they can be nacked when
// the batch never reaches the worker and tracked as held when it does.
type delivery struct {
	stream, group string
	ids           []string
	timeout       time.Duration
}

func subscriptionKey(stream, group string) string { return stream + "/" + group }

// helloStreams validates a Hello's subscriptions and fills their defaults:
// group "default", consumer the worker id. Naming a stream/group twice with
// the same consumer is harmless; with different consumers it is refused.
func helloStreams(in []*flov1.StreamSubscription, workerID string) (map[string]*subscription, error) {
	if len(in) > maxSubscriptions {
		return nil, status.Errorf(codes.InvalidArgument, "Hello names %d streams, at most %d", len(in), maxSubscriptions)
	}
	if len(in) == 0 {
		// An action worker's session keeps nothing for streams.
		return nil, nil
	}
	subs := make(map[string]*subscription, len(in))
	for i, sub := range in {
		group := cmp.Or(sub.GetGroup(), defaultGroup)
		consumer := cmp.Or(sub.GetConsumer(), workerID)
		if err := text.StreamName("stream", sub.GetStream()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "Hello's streams[%d]: %v", i, err)
		}
		if err := text.StreamName("group", group); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "Hello's streams[%d]: %v", i, err)
		}
		// A consumer defaults to its worker's id, so it follows that rule.
		if err := text.WorkerID("consumer", consumer); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "Hello's streams[%d]: %v", i, err)
		}
		key := subscriptionKey(sub.GetStream(), group)
		if prev, ok := subs[key]; ok {
			if prev.consumer != consumer {
				return nil, status.Errorf(codes.InvalidArgument, "Hello subscribes to %s twice, as consumers %q and %q", key, prev.consumer, consumer)
			}
			continue
		}
		subs[key] = &subscription{stream: sub.GetStream(), group: group, consumer: consumer}
	}
	return subs, nil
}

// subscriptionNames lists subscriptions as "stream/group" for logs.
func subscriptionNames(subs map[string]*subscription) []string {
	names := make([]string, 0, len(subs))
	for key := range subs {
		names = append(names, key)
	}
	slices.Sort(names)
	return names
}

// streamRead hands the read a StreamRead asks for to its group's read hub. More than maxReads
// reads of one stream/group outstanding is a protocol error. A draining
// worker's read is answered at once with an empty batch.
func (s *session) streamRead(r *flov1.StreamRead) error {
	group := cmp.Or(r.GetGroup(), defaultGroup)
	key := subscriptionKey(r.GetStream(), group)
	sub, ok := s.subs[key]
	if !ok {
		return status.Errorf(codes.InvalidArgument, "StreamRead names %s, which the Hello did not subscribe to", key)
	}
	if c := r.GetConsumer(); c != "" && c != sub.consumer {
		return status.Errorf(codes.InvalidArgument, "StreamRead for %s names consumer %q, the Hello named %q", key, c, sub.consumer)
	}
	if r.GetCount() < 0 || r.GetBlockMs() < 0 || r.GetMessageTimeoutMs() < 0 {
		return status.Error(codes.InvalidArgument, "StreamRead's count, block_ms and message_timeout_ms must not be negative")
	}
	block := defaultBlock
	if r.GetBlockMs() > 0 {
		block = min(millis.Duration(r.GetBlockMs()), maxBlock)
	}
	count := r.GetCount()
	if count == 0 {
		count = defaultReadCount
	}
	rc := &readCall{block: block, req: &flov1.GroupReadRequest{
		Namespace: s.namespace, Stream: sub.stream, Group: sub.group, Consumer: sub.consumer,
		Count:            min(count, int32(s.srv.opts.MaxReadRecords)),
		MessageTimeoutMs: r.GetMessageTimeoutMs(),
	}}

	s.readsMu.Lock()
	if len(sub.reads) >= maxReads {
		s.readsMu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "%d StreamReads for %s are already outstanding; send the next after a RecordBatch", maxReads, key)
	}
	// Every record a read may bring must fit among the held records, so
	// that each one sent can be tracked and settled; a worker holding the
	// most gets empty batches until it settles some.
	room := maxHeldRecords - s.records.len(time.Now()) - s.outstandingLocked()
	rc.req.Count = min(rc.req.Count, int32(max(room, 0)))
	if s.readsClosed || s.workerDraining.Load() || rc.req.Count == 0 {
		if !s.readsEnded {
			s.enqueue(outgoing{msg: emptyRecordBatch(sub.stream, sub.group)})
		}
		s.readsMu.Unlock()
		return nil
	}
	sub.reads = append(sub.reads, rc)
	s.readsMu.Unlock()

	s.srv.hubRead(s, sub, rc)
	return nil
}

// finishRead answers read rc with records, unless it no longer may: the
// session ended or closed its reads, or the worker is draining. Records that
// are not handed to the writer are nacked at once.
func (s *session) finishRead(sub *subscription, rc *readCall, records []*flov1.StreamRecord) {
	d := &delivery{stream: sub.stream, group: sub.group, timeout: defaultMessageTimeout}
	if ms := rc.req.GetMessageTimeoutMs(); ms > 0 {
		d.timeout = min(millis.Duration(ms), maxMessageTimeout)
	}
	for _, r := range records {
		d.ids = append(d.ids, r.GetId())
		// The worker reads payload bytes; the JSON copy is for REST callers.
		r.Value = nil
	}
	item := outgoing{msg: &flov1.ServerMessage{Msg: &flov1.ServerMessage_RecordBatch{RecordBatch: &flov1.RecordBatch{
		Stream: sub.stream, Group: sub.group, Records: records,
	}}}}
	if len(records) > 0 {
		item.records = d
	}
	s.readsMu.Lock()
	sent := false
	if i := slices.Index(sub.reads, rc); i >= 0 && !s.readsClosed && !s.workerDraining.Load() {
		sub.reads = slices.Delete(sub.reads, i, i+1)
		// Held from the moment the read stops counting as outstanding, so
		// reads never bring more than maxHeldRecords, and an ack that comes
		// back at once finds the record.
		if item.records != nil {
			s.records.add(d, time.Now())
		}
		sent = s.enqueue(item)
		if !sent && item.records != nil {
			s.records.remove(d.stream, d.group, d.ids)
		}
	}
	s.readsMu.Unlock()
	if !sent && len(records) > 0 {
		s.handBack(d, false)
	}
}

// outstandingLocked is how many records the session's outstanding reads may
// still bring; the caller holds readsMu.
func (s *session) outstandingLocked() int {
	n := 0
	for _, sub := range s.subs {
		for _, rc := range sub.reads {
			n += int(rc.req.GetCount())
		}
	}
	return n
}

// closeReads stops the session's reads: none starts or is answered with
// records from now on. With answer, every outstanding read gets its empty
// RecordBatch now (a drain); without, the session is ending: nothing is
// queued any more, so the writer's queue can close.
func (s *session) closeReads(answer bool) {
	s.readsMu.Lock()
	defer s.readsMu.Unlock()
	s.readsClosed = true
	s.readsShut.Store(true)
	if !answer {
		s.readsEnded = true
	}
	var dropped []*readCall
	for _, sub := range s.subs {
		for _, rc := range sub.reads {
			if !s.readsEnded {
				s.enqueue(outgoing{msg: emptyRecordBatch(sub.stream, sub.group)})
			}
			dropped = append(dropped, rc)
		}
		sub.reads = nil
	}
	s.srv.dropReads(dropped)
}

// handBack hands records the worker did not take back to their group at
// once, without waiting for their message timeout. Records never handed to
// the stream are released: no worker saw them, so their delivery does not
// count toward the group's max deliveries. Records whose send failed may
// have reached the worker, so they are nacked, which counts it.
func (s *session) handBack(d *delivery, maybeSent bool) {
	ctx, cancel := context.WithTimeout(s.calls, callTimeout)
	defer cancel()
	const reason = "not delivered: the worker stream ended or is draining"
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		if maybeSent {
			_, err = s.srv.opts.Streams.Nack(ctx, &flov1.NackRequest{Namespace: s.namespace, Stream: d.stream, Group: d.group, Ids: d.ids, Reason: reason})
		} else {
			_, err = s.srv.opts.Streams.Release(ctx, &streamsv1.ReleaseRequest{Namespace: s.namespace, Stream: d.stream, Group: d.group, Ids: d.ids, Reason: reason})
		}
		return err
	})
	if err != nil {
		s.log.WarnContext(ctx, "handing back undelivered records failed; they are redelivered after their message timeout",
			slog.String("stream", d.stream), slog.String("group", d.group), slog.Int("records", len(d.ids)), slog.Any("error", err))
	}
}

func emptyRecordBatch(stream, group string) *flov1.ServerMessage {
	return &flov1.ServerMessage{Msg: &flov1.ServerMessage_RecordBatch{RecordBatch: &flov1.RecordBatch{Stream: stream, Group: group}}}
}
