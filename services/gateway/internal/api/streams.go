package api

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/gateway/internal/namespace"

	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Limits of the stream calls the gateway enforces itself; the streams
// service owns every other rule (retention, partitions, headers, ids).
const (
	// MaxAppendRecords caps the records of one Append.
	MaxAppendRecords = 10_000
	// MaxReadCount is the most records a Read, GroupRead or StreamRead
	// returns; larger counts are capped.
	MaxReadCount = 10_000
	// DefaultReadCount and DefaultGroupReadCount are the streams service's
	// answers to a count of zero.
	DefaultReadCount      = 100
	DefaultGroupReadCount = 10
	// ReadBudgetBytes bounds the records one read may bring back when each is
	// as large as the payload limit allows; see MaxReadRecords.
	ReadBudgetBytes = 256 << 20
	// recordOverhead is room above the payload limit for a record's id, key,
	// headers and trace context, as a claim allows for a task's fields. Key
	// and headers may reach 64 KiB, so the budget is approximate; the
	// streams connection's receive limit leaves ample room above it.
	recordOverhead = 4 << 10
)

// MaxReadRecords is how many records one read asks the streams service for
// at most, so that a read of records at the payload limit stays within
// ReadBudgetBytes: a group read hands its records out (they are pending once
// read), so an answer too large to receive would strand them until their
// message timeout. Reads return "up to count" records, so asking for fewer
// changes no contract; callers read on.
func MaxReadRecords(maxPayloadBytes int) int {
	return min(MaxReadCount, max(1, ReadBudgetBytes/(maxPayloadBytes+recordOverhead)))
}

// ReadCount returns the count to send the streams service for a read that
// asked for count, where def is the service's default for zero and limit is
// MaxReadRecords. A negative count goes through unchanged, for the streams
// service to refuse with its own message; a count above MaxReadCount is
// capped like the streams service caps it.
func ReadCount(count, def int32, limit int) int32 {
	switch {
	case count < 0:
		return count
	case count == 0 && int(def) <= limit:
		return 0
	case count == 0:
		return int32(limit)
	}
	return min(count, int32(limit))
}

// StreamServer implements flov1.StreamServiceServer by forwarding to the
// streams service, which owns streams, groups and records and whose status
// codes reach the caller unchanged. The gateway checks the namespace, as for
// every call, the names, and the payload limit, so an oversized record is
// refused here with its index before anything travels.
type StreamServer struct {
	flov1.UnimplementedStreamServiceServer

	streams         streamsv1.StreamsClient
	namespaces      *namespace.Cache
	maxPayloadBytes int
	maxReadRecords  int
	log             *slog.Logger
}

// NewStreamServer returns a StreamServer backed by the streams service.
func NewStreamServer(streams streamsv1.StreamsClient, namespaces *namespace.Cache, maxPayloadBytes int, log *slog.Logger) *StreamServer {
	return &StreamServer{
		streams:         streams,
		namespaces:      namespaces,
		maxPayloadBytes: maxPayloadBytes,
		maxReadRecords:  MaxReadRecords(maxPayloadBytes),
		log:             log,
	}
}

// check checks the namespace, then each of the names given as field, name
// pairs.
func (s *StreamServer) check(ctx context.Context, ns string, names ...string) error {
	if err := CheckNamespace(ctx, s.log, s.namespaces, ns); err != nil {
		return err
	}
	for i := 0; i+1 < len(names); i += 2 {
		if err := text.StreamName(names[i], names[i+1]); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// CreateStream creates a stream; the streams service validates its
// partitions and retention.
func (s *StreamServer) CreateStream(ctx context.Context, req *flov1.CreateStreamRequest) (*flov1.Stream, error) {
	if err := s.check(ctx, req.GetNamespace(), "name", req.GetName()); err != nil {
		return nil, err
	}
	st, err := s.streams.CreateStream(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "create stream", err)
	}
	return st, nil
}

// GetStream returns a stream with its length, ids and groups.
func (s *StreamServer) GetStream(ctx context.Context, req *flov1.GetStreamRequest) (*flov1.StreamInfo, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream()); err != nil {
		return nil, err
	}
	info, err := s.streams.GetStream(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "get stream", err)
	}
	return info, nil
}

// ListStreams lists a namespace's streams.
func (s *StreamServer) ListStreams(ctx context.Context, req *flov1.ListStreamsRequest) (*flov1.ListStreamsResponse, error) {
	if err := s.check(ctx, req.GetNamespace()); err != nil {
		return nil, err
	}
	resp, err := s.streams.ListStreams(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "list streams", err)
	}
	return resp, nil
}

// DeleteStream removes a stream with its records and groups.
func (s *StreamServer) DeleteStream(ctx context.Context, req *flov1.GetStreamRequest) (*flov1.DeleteStreamResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream()); err != nil {
		return nil, err
	}
	resp, err := s.streams.DeleteStream(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "delete stream", err)
	}
	return resp, nil
}

// Append adds records to a stream. A record's value (a JSON value, for REST
// callers) becomes its payload bytes exactly as InvokeTask's input does, so
// the streams service and stream workers only ever see bytes. Nothing is
// appended when any record fails a check; the error names its index.
func (s *StreamServer) Append(ctx context.Context, req *flov1.AppendRequest) (*flov1.AppendResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream()); err != nil {
		return nil, err
	}
	in := req.GetRecords()
	switch {
	case len(in) == 0:
		return nil, status.Error(codes.InvalidArgument, "records must hold at least one record")
	case len(in) > MaxAppendRecords:
		return nil, status.Errorf(codes.InvalidArgument, "records holds %d records, limit is %d", len(in), MaxAppendRecords)
	}
	out := make([]*flov1.AppendRecord, len(in))
	for i, r := range in {
		payload := r.GetPayload()
		if len(payload) == 0 && r.GetValue() != nil {
			var err error
			if payload, err = encodeJSON(r.GetValue()); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "records[%d]: encode value as JSON: %v", i, err)
			}
		}
		if len(payload) > s.maxPayloadBytes {
			return nil, status.Errorf(codes.InvalidArgument, "records[%d]: payload is %d bytes, limit is %d", i, len(payload), s.maxPayloadBytes)
		}
		out[i] = &flov1.AppendRecord{Payload: payload, Headers: r.GetHeaders(), Key: r.GetKey()}
	}
	resp, err := s.streams.Append(ctx, &flov1.AppendRequest{Namespace: req.GetNamespace(), Stream: req.GetStream(), Records: out})
	if err != nil {
		return nil, upstream(ctx, s.log, "append records", err)
	}
	return resp, nil
}

// Read returns records by id range or from the tail.
func (s *StreamServer) Read(ctx context.Context, req *flov1.ReadRequest) (*flov1.ReadResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream()); err != nil {
		return nil, err
	}
	fwd := proto.CloneOf(req)
	fwd.Count = ReadCount(req.GetCount(), DefaultReadCount, s.maxReadRecords)
	fwd.Tail = ReadCount(req.GetTail(), 0, s.maxReadRecords)
	resp, err := s.streams.Read(ctx, fwd)
	if err != nil {
		return nil, upstream(ctx, s.log, "read records", err)
	}
	fillValues(resp.GetRecords())
	return resp, nil
}

// CreateGroup creates a consumer group; the streams service checks its start.
func (s *StreamServer) CreateGroup(ctx context.Context, req *flov1.CreateGroupRequest) (*flov1.ConsumerGroup, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream(), "name", req.GetName()); err != nil {
		return nil, err
	}
	g, err := s.streams.CreateGroup(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "create group", err)
	}
	return g, nil
}

// ListGroups lists a stream's consumer groups with their lag.
func (s *StreamServer) ListGroups(ctx context.Context, req *flov1.ListGroupsRequest) (*flov1.ListGroupsResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream()); err != nil {
		return nil, err
	}
	resp, err := s.streams.ListGroups(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "list groups", err)
	}
	return resp, nil
}

// DeleteGroup removes a consumer group and its pending records.
func (s *StreamServer) DeleteGroup(ctx context.Context, req *flov1.GetGroupRequest) (*flov1.DeleteGroupResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream(), "group", req.GetGroup()); err != nil {
		return nil, err
	}
	resp, err := s.streams.DeleteGroup(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "delete group", err)
	}
	return resp, nil
}

// ListPending lists a group's records handed out and not yet acked.
func (s *StreamServer) ListPending(ctx context.Context, req *flov1.ListPendingRequest) (*flov1.ListPendingResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream(), "group", req.GetGroup()); err != nil {
		return nil, err
	}
	resp, err := s.streams.ListPending(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "list pending", err)
	}
	return resp, nil
}

// GroupRead hands records of a group to one consumer. Stream workers read
// over their worker stream instead; this is for callers that consume by
// hand.
func (s *StreamServer) GroupRead(ctx context.Context, req *flov1.GroupReadRequest) (*flov1.GroupReadResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream(), "group", req.GetGroup()); err != nil {
		return nil, err
	}
	if err := text.WorkerID("consumer", req.GetConsumer()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	fwd := proto.CloneOf(req)
	fwd.Count = ReadCount(req.GetCount(), DefaultGroupReadCount, s.maxReadRecords)
	resp, err := s.streams.GroupRead(ctx, fwd)
	if err != nil {
		return nil, upstream(ctx, s.log, "group read", err)
	}
	fillValues(resp.GetRecords())
	return resp, nil
}

// Ack settles records of a group.
func (s *StreamServer) Ack(ctx context.Context, req *flov1.AckRequest) (*flov1.AckResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream(), "group", req.GetGroup()); err != nil {
		return nil, err
	}
	resp, err := s.streams.Ack(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "ack records", err)
	}
	return resp, nil
}

// Nack hands records back to their group for redelivery.
func (s *StreamServer) Nack(ctx context.Context, req *flov1.NackRequest) (*flov1.NackResponse, error) {
	if err := s.check(ctx, req.GetNamespace(), "stream", req.GetStream(), "group", req.GetGroup()); err != nil {
		return nil, err
	}
	resp, err := s.streams.Nack(ctx, req)
	if err != nil {
		return nil, upstream(ctx, s.log, "nack records", err)
	}
	return resp, nil
}

// fillValues sets the value of records whose payload is JSON and that came
// without one, so REST callers see their JSON as JSON whichever way the
// streams service answered.
func fillValues(records []*flov1.StreamRecord) {
	for _, r := range records {
		if r.GetValue() != nil || len(r.GetPayload()) == 0 {
			continue
		}
		v := &structpb.Value{}
		if protojson.Unmarshal(r.GetPayload(), v) == nil {
			r.Value = v
		}
	}
}

// NoStreams stands in for the streams service when a gateway is configured
// without one: every call fails with Unavailable.
var NoStreams streamsv1.StreamsClient = noStreams{}

type noStreams struct{}

// ErrNoStreams is the status of every stream call on a gateway without a
// streams service.
var ErrNoStreams = status.Error(codes.Unavailable, "streams service not configured (FLO_STREAMS_ADDR)")

func (noStreams) CreateStream(context.Context, *flov1.CreateStreamRequest, ...grpc.CallOption) (*flov1.Stream, error) {
	return nil, ErrNoStreams
}

func (noStreams) GetStream(context.Context, *flov1.GetStreamRequest, ...grpc.CallOption) (*flov1.StreamInfo, error) {
	return nil, ErrNoStreams
}

func (noStreams) ListStreams(context.Context, *flov1.ListStreamsRequest, ...grpc.CallOption) (*flov1.ListStreamsResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) DeleteStream(context.Context, *flov1.GetStreamRequest, ...grpc.CallOption) (*flov1.DeleteStreamResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) Append(context.Context, *flov1.AppendRequest, ...grpc.CallOption) (*flov1.AppendResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) Read(context.Context, *flov1.ReadRequest, ...grpc.CallOption) (*flov1.ReadResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) CreateGroup(context.Context, *flov1.CreateGroupRequest, ...grpc.CallOption) (*flov1.ConsumerGroup, error) {
	return nil, ErrNoStreams
}

func (noStreams) ListGroups(context.Context, *flov1.ListGroupsRequest, ...grpc.CallOption) (*flov1.ListGroupsResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) DeleteGroup(context.Context, *flov1.GetGroupRequest, ...grpc.CallOption) (*flov1.DeleteGroupResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) ListPending(context.Context, *flov1.ListPendingRequest, ...grpc.CallOption) (*flov1.ListPendingResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) GroupRead(context.Context, *flov1.GroupReadRequest, ...grpc.CallOption) (*flov1.GroupReadResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) Release(context.Context, *streamsv1.ReleaseRequest, ...grpc.CallOption) (*flov1.NackResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) GroupReadMany(context.Context, *streamsv1.GroupReadManyRequest, ...grpc.CallOption) (*streamsv1.GroupReadManyResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) Ack(context.Context, *flov1.AckRequest, ...grpc.CallOption) (*flov1.AckResponse, error) {
	return nil, ErrNoStreams
}

func (noStreams) Nack(context.Context, *flov1.NackRequest, ...grpc.CallOption) (*flov1.NackResponse, error) {
	return nil, ErrNoStreams
}
