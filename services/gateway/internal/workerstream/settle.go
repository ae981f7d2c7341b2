package workerstream

import (
	"cmp"
	"context"
	"log/slog"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/gateway/internal/streamname"
)

// maxSettleIDs caps the ids of one Ack or Nack call, and about how many ids
// settleQueued gathers before it calls.
const maxSettleIDs = 10_000

// settle is one StreamAck or StreamNack.
type settle struct {
	stream, group string
	ids           []string
	nack          bool
	delayMS       int64
	reason        string
}

// settleKey is what settles must share to be merged into one call.
type settleKey struct {
	stream, group string
	nack          bool
	delayMS       int64
	reason        string
}

// queueSettle checks a StreamAck or StreamNack and hands it to settleQueued,
// waiting while its queue is full; while it waits the reader reads nothing
// (back-pressure, as for results). Names and ids are checked here, so one
// malformed message cannot fail a merged call for the good ones.
func (s *session) queueSettle(st settle) error {
	kind := "StreamAck"
	if st.nack {
		kind = "StreamNack"
	}
	if s.srv.opts.Streams == nil {
		return errNoStreams
	}
	st.group = cmp.Or(st.group, defaultGroup)
	if err := text.StreamName("stream", st.stream); err != nil {
		return status.Errorf(codes.InvalidArgument, "%s: %v", kind, err)
	}
	if err := text.StreamName("group", st.group); err != nil {
		return status.Errorf(codes.InvalidArgument, "%s: %v", kind, err)
	}
	for _, id := range st.ids {
		if err := streamname.CheckID(id); err != nil {
			return status.Errorf(codes.InvalidArgument, "%s: %v", kind, err)
		}
	}
	st.ids = s.ownedRecords(kind, st)
	if len(st.ids) == 0 {
		return nil
	}
	s.settles.put(st, s.ctx.Done())
	return nil
}

// ownedRecords returns the ids of st the session may settle: records it
// sent its worker (or that another stream of the worker did). Others are
// dropped with a warning, since a StreamAck has no answer; they stay
// pending for the consumer they were sent to.
func (s *session) ownedRecords(kind string, st settle) []string {
	owned := make([]string, 0, len(st.ids))
	for _, id := range st.ids {
		if s.ownsRecord(st.stream, st.group, id) {
			owned = append(owned, id)
		}
	}
	if n := len(st.ids) - len(owned); n > 0 {
		s.log.WarnContext(s.ctx, kind+" of records this worker stream was not sent dropped",
			slog.String("stream", st.stream), slog.String("group", st.group), slog.Int("records", n))
	}
	return owned
}

// settleQueued forwards acks and nacks as they come, everything queued at
// once merged into one call per stream/group (and nack delay and reason):
// while one call is in flight the next batch gathers, as reportQueued does
// for results. What is queued when the session ends is forwarded before the
// session returns, so acks a worker sent just before disconnecting are
// recorded.
func (s *session) settleQueued(first settle) {
	s.settleBatch(s.gatherSettles(first))
}

// gatherSettles returns first and whatever else is queued, up to about
// maxSettleIDs ids.
func (s *session) gatherSettles(first settle) []settle {
	batch := []settle{first}
	n := len(first.ids)
	for n < maxSettleIDs {
		st, ok := s.settles.next()
		if !ok {
			break
		}
		batch = append(batch, st)
		n += len(st.ids)
	}
	return batch
}

// settleBatch merges settles by key, keeping the order in which keys first
// appear, and makes the calls.
func (s *session) settleBatch(batch []settle) {
	var keys []settleKey
	ids := make(map[settleKey][]string)
	for _, st := range batch {
		k := settleKey{stream: st.stream, group: st.group, nack: st.nack, delayMS: st.delayMS, reason: st.reason}
		if _, ok := ids[k]; !ok {
			keys = append(keys, k)
		}
		ids[k] = append(ids[k], st.ids...)
	}
	for _, k := range keys {
		for chunk := range slices.Chunk(ids[k], maxSettleIDs) {
			s.settleCall(k, chunk)
		}
	}
}

// settleCall makes one Ack or Nack call, retried while the streams service
// is unavailable. An error retrying cannot fix ends the session with its
// status; records whose ack is lost otherwise are redelivered after their
// message timeout, which at-least-once delivery allows.
func (s *session) settleCall(k settleKey, ids []string) {
	// Forgotten before the call: a nacked record may come back to this
	// stream before the call returns, and that delivery is the worker's to
	// settle.
	s.records.remove(k.stream, k.group, ids)
	ctx, cancel := context.WithTimeout(s.calls, callTimeout)
	defer cancel()
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		if k.nack {
			_, err = s.srv.opts.Streams.Nack(ctx, &flov1.NackRequest{
				Namespace: s.namespace, Stream: k.stream, Group: k.group, Ids: ids, DelayMs: k.delayMS, Reason: k.reason,
			})
		} else {
			_, err = s.srv.opts.Streams.Ack(ctx, &flov1.AckRequest{
				Namespace: s.namespace, Stream: k.stream, Group: k.group, Ids: ids,
			})
		}
		return err
	})
	if err == nil {
		return
	}
	what := "ack"
	if k.nack {
		what = "nack"
	}
	s.log.WarnContext(ctx, what+" records failed", slog.String("stream", k.stream), slog.String("group", k.group),
		slog.Int("records", len(ids)), slog.Any("error", err))
	if permanent(err) {
		s.fail(status.Convert(err).Err())
	}
}
