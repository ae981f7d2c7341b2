// Package grpcapi is the streams service's gRPC transport: it decodes
// requests, calls the catalog, appender, scanner and groups, and encodes
// their answers. Domain errors become status codes in one place,
// grpcserver.ErrorInterceptor, with streamsStatus for the errors only this
// service has.
package grpcapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/coalesce"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/grpcserver"
	"github.com/razorbill/flo/libs/millis"
	"github.com/razorbill/flo/libs/page"
	streamsv1 "github.com/razorbill/flo/proto/gen/flo/streams/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/streams/internal/appender"
	"github.com/razorbill/flo/services/streams/internal/catalog"
	"github.com/razorbill/flo/services/streams/internal/group"
	"github.com/razorbill/flo/services/streams/internal/logread"
	"github.com/razorbill/flo/services/streams/internal/record"
	"github.com/razorbill/flo/services/streams/internal/scan"
	"github.com/razorbill/flo/services/streams/internal/store"
)

// MaxMessageBytes is the largest request the server accepts: an append of
// many records. Callers should allow responses this large too.
const MaxMessageBytes = 64 << 20

// Deps are what the server calls.
type Deps struct {
	Catalog  *catalog.Catalog
	Appender *appender.Appender
	Scanner  *scan.Scanner
	Groups   *group.Groups
	Log      *slog.Logger
}

// Server implements streamsv1.StreamsServer.
type Server struct {
	streamsv1.UnimplementedStreamsServer
	d Deps
}

// NewGRPCServer returns a gRPC server with the Streams service registered,
// refusing calls without auth's internal credential, and the tracing,
// recovery and error-mapping interceptors installed.
func NewGRPCServer(d Deps, auth config.Auth) (*grpc.Server, error) {
	s, err := grpcserver.NewInternal(auth, d.Log, streamsStatus, grpc.MaxRecvMsgSize(MaxMessageBytes))
	if err != nil {
		return nil, err
	}
	streamsv1.RegisterStreamsServer(s, &Server{d: d})
	return s, nil
}

// streamsStatus maps the errors only the streams service has.
func streamsStatus(err error) error {
	var exists *catalog.ExistsError
	switch {
	case errors.As(err, &exists):
		return status.Error(codes.AlreadyExists, exists.Message)
	case errors.Is(err, logread.ErrUnavailable):
		return status.Error(codes.Unavailable, "the log is unavailable, retry later")
	case errors.Is(err, coalesce.ErrStopped):
		return status.Error(codes.Unavailable, "streams service is stopping")
	}
	return nil
}

// CreateStream creates a stream and its topic.
func (s *Server) CreateStream(ctx context.Context, req *flov1.CreateStreamRequest) (*flov1.Stream, error) {
	st, err := s.d.Catalog.CreateStream(ctx, catalog.Spec{
		Namespace: req.GetNamespace(), Name: req.GetName(), Partitions: req.GetPartitions(),
		RetentionMS: req.GetRetentionMs(), RetentionBytes: req.GetRetentionBytes(),
	})
	if err != nil {
		return nil, err
	}
	return streamProto(st), nil
}

// GetStream describes a stream.
func (s *Server) GetStream(ctx context.Context, req *flov1.GetStreamRequest) (*flov1.StreamInfo, error) {
	info, err := s.d.Catalog.Info(ctx, req.GetNamespace(), req.GetStream())
	if err != nil {
		return nil, err
	}
	out := &flov1.StreamInfo{Stream: streamProto(info.Stream), Length: info.Length}
	if info.First != nil {
		out.FirstId = info.First.String()
	}
	if info.Last != nil {
		out.LastId = info.Last.String()
	}
	for _, g := range info.Groups {
		out.Groups = append(out.Groups, groupProto(g))
	}
	return out, nil
}

// ListStreams lists a namespace's streams.
func (s *Server) ListStreams(ctx context.Context, req *flov1.ListStreamsRequest) (*flov1.ListStreamsResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 1)
	if err != nil {
		return nil, err
	}
	sts, next, err := s.d.Catalog.ListStreams(ctx, req.GetNamespace(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListStreamsResponse{Streams: make([]*flov1.Stream, len(sts)), NextPageToken: next}
	for i, st := range sts {
		out.Streams[i] = streamProto(st)
	}
	return out, nil
}

// DeleteStream deletes a stream with its records and groups.
func (s *Server) DeleteStream(ctx context.Context, req *flov1.GetStreamRequest) (*flov1.DeleteStreamResponse, error) {
	if err := s.d.Catalog.DeleteStream(ctx, req.GetNamespace(), req.GetStream()); err != nil {
		return nil, err
	}
	return &flov1.DeleteStreamResponse{}, nil
}

// Append appends records and returns their ids in request order.
func (s *Server) Append(ctx context.Context, req *flov1.AppendRequest) (*flov1.AppendResponse, error) {
	st, err := s.d.Catalog.GetStream(ctx, req.GetNamespace(), req.GetStream())
	if err != nil {
		return nil, err
	}
	recs := make([]appender.Record, len(req.GetRecords()))
	for i, r := range req.GetRecords() {
		payload := r.GetPayload()
		if len(payload) == 0 && r.GetValue() != nil {
			if payload, err = encodeJSON(r.GetValue()); err != nil {
				return nil, fault.Invalidf("records[%d].value: %v", i, err)
			}
		}
		recs[i] = appender.Record{Payload: payload, Key: r.GetKey(), Headers: r.GetHeaders()}
	}
	ids, err := s.d.Appender.Append(ctx, st, recs)
	if err != nil {
		return nil, err
	}
	out := &flov1.AppendResponse{Ids: make([]string, len(ids))}
	for i, id := range ids {
		out.Ids[i] = id.String()
	}
	return out, nil
}

// Read reads a stream by id range or from its tail.
func (s *Server) Read(ctx context.Context, req *flov1.ReadRequest) (*flov1.ReadResponse, error) {
	res, err := s.d.Scanner.Read(ctx, scan.Request{
		Namespace: req.GetNamespace(), Stream: req.GetStream(), Start: req.GetStart(), End: req.GetEnd(),
		Count: int(req.GetCount()), Block: millis.Duration(req.GetBlockMs()), Tail: int(req.GetTail()),
	})
	if err != nil {
		return nil, err
	}
	out := &flov1.ReadResponse{Records: make([]*flov1.StreamRecord, len(res.Records)), Next: res.Next}
	for i, r := range res.Records {
		out.Records[i] = recordProto(r, true)
	}
	return out, nil
}

// CreateGroup creates a consumer group.
func (s *Server) CreateGroup(ctx context.Context, req *flov1.CreateGroupRequest) (*flov1.ConsumerGroup, error) {
	g, err := s.d.Catalog.CreateGroup(ctx, catalog.GroupSpec{
		Namespace: req.GetNamespace(), Stream: req.GetStream(), Name: req.GetName(),
		Start: req.GetStart(), MaxDeliveries: req.GetMaxDeliveries(), Mode: req.GetMode(),
	})
	if err != nil {
		return nil, err
	}
	return groupProto(g), nil
}

// ListGroups lists a stream's groups with their lag.
func (s *Server) ListGroups(ctx context.Context, req *flov1.ListGroupsRequest) (*flov1.ListGroupsResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 1)
	if err != nil {
		return nil, err
	}
	gs, next, err := s.d.Catalog.ListGroups(ctx, req.GetNamespace(), req.GetStream(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListGroupsResponse{Groups: make([]*flov1.ConsumerGroup, len(gs)), NextPageToken: next}
	for i, g := range gs {
		out.Groups[i] = groupProto(g)
	}
	return out, nil
}

// DeleteGroup deletes a group and what it has pending.
func (s *Server) DeleteGroup(ctx context.Context, req *flov1.GetGroupRequest) (*flov1.DeleteGroupResponse, error) {
	k := store.GroupKey{Namespace: req.GetNamespace(), Stream: req.GetStream(), Group: req.GetGroup()}
	if _, err := s.d.Catalog.DeleteGroup(ctx, k); err != nil {
		return nil, err
	}
	return &flov1.DeleteGroupResponse{}, nil
}

// ListPending lists a group's pending records.
func (s *Server) ListPending(ctx context.Context, req *flov1.ListPendingRequest) (*flov1.ListPendingResponse, error) {
	k := store.GroupKey{Namespace: req.GetNamespace(), Stream: req.GetStream(), Group: req.GetGroup()}
	p, err := page.New(req.GetLimit(), req.GetPageToken(), group.MaxPendingLimit, 2)
	if err != nil {
		return nil, err
	}
	entries, total, next, err := s.d.Groups.Pending(ctx, k, req.GetConsumer(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListPendingResponse{Entries: make([]*flov1.PendingEntry, len(entries)), Total: total, NextPageToken: next}
	for i, e := range entries {
		out.Entries[i] = &flov1.PendingEntry{
			Id: e.ID.String(), Consumer: e.Consumer, DeliveryCount: int32(e.DeliveryCount),
			DeliveredAt: timestamppb.New(e.DeliveredAt), RedeliverAt: timestamppb.New(e.RedeliverAt),
		}
	}
	return out, nil
}

// GroupRead hands records to one consumer of a group.
func (s *Server) GroupRead(ctx context.Context, req *flov1.GroupReadRequest) (*flov1.GroupReadResponse, error) {
	recs, err := s.d.Groups.Read(ctx, group.ReadRequest{
		Key:      store.GroupKey{Namespace: req.GetNamespace(), Stream: req.GetStream(), Group: req.GetGroup()},
		Consumer: req.GetConsumer(), Count: int(req.GetCount()),
		Block:          millis.Duration(req.GetBlockMs()),
		MessageTimeout: millis.Duration(req.GetMessageTimeoutMs()),
	})
	if err != nil {
		return nil, err
	}
	out := &flov1.GroupReadResponse{Records: make([]*flov1.StreamRecord, len(recs))}
	for i, r := range recs {
		// Workers decode payloads themselves; JSON values here would
		// double the bytes and cost a parse per record.
		out.Records[i] = recordProto(r, false)
	}
	return out, nil
}

// GroupReadMany reads for many consumers of one group as one waiting call:
// the gateway's idle stream workers of a group share it.
func (s *Server) GroupReadMany(ctx context.Context, req *streamsv1.GroupReadManyRequest) (*streamsv1.GroupReadManyResponse, error) {
	reads := req.GetReads()
	reqs := make([]group.ReadRequest, len(reads))
	for i, r := range reads {
		reqs[i] = group.ReadRequest{
			Consumer: r.GetConsumer(), Count: int(r.GetCount()),
			MessageTimeout: millis.Duration(r.GetMessageTimeoutMs()),
		}
	}
	k := store.GroupKey{Namespace: req.GetNamespace(), Stream: req.GetStream(), Group: req.GetGroup()}
	recs, err := s.d.Groups.ReadMany(ctx, k, reqs, millis.Duration(req.GetBlockMs()))
	if err != nil {
		return nil, err
	}
	out := &streamsv1.GroupReadManyResponse{Results: make([]*streamsv1.ConsumerRecords, len(reads))}
	for i, rs := range recs {
		res := &streamsv1.ConsumerRecords{Consumer: reads[i].GetConsumer()}
		for _, r := range rs {
			res.Records = append(res.Records, recordProto(r, false))
		}
		out.Results[i] = res
	}
	return out, nil
}

// Ack settles records.
func (s *Server) Ack(ctx context.Context, req *flov1.AckRequest) (*flov1.AckResponse, error) {
	k := store.GroupKey{Namespace: req.GetNamespace(), Stream: req.GetStream(), Group: req.GetGroup()}
	n, err := s.d.Groups.Ack(ctx, k, req.GetIds())
	if err != nil {
		return nil, err
	}
	return &flov1.AckResponse{Acked: int32(n)}, nil
}

// Nack hands records back for redelivery.
func (s *Server) Nack(ctx context.Context, req *flov1.NackRequest) (*flov1.NackResponse, error) {
	k := store.GroupKey{Namespace: req.GetNamespace(), Stream: req.GetStream(), Group: req.GetGroup()}
	n, err := s.d.Groups.Nack(ctx, k, req.GetIds(), millis.Duration(req.GetDelayMs()), req.GetReason())
	if err != nil {
		return nil, err
	}
	return &flov1.NackResponse{Nacked: int32(n)}, nil
}

// Release hands back records that never reached a consumer, without
// counting their delivery.
func (s *Server) Release(ctx context.Context, req *streamsv1.ReleaseRequest) (*flov1.NackResponse, error) {
	k := store.GroupKey{Namespace: req.GetNamespace(), Stream: req.GetStream(), Group: req.GetGroup()}
	n, err := s.d.Groups.Release(ctx, k, req.GetIds(), req.GetReason())
	if err != nil {
		return nil, err
	}
	return &flov1.NackResponse{Nacked: int32(n)}, nil
}

func streamProto(st store.Stream) *flov1.Stream {
	return &flov1.Stream{
		Namespace: st.Namespace, Name: st.Name, Partitions: st.Partitions,
		RetentionMs: st.RetentionMS, RetentionBytes: st.RetentionBytes, CreatedAt: timestamppb.New(st.CreatedAt),
	}
}

func groupProto(g catalog.GroupInfo) *flov1.ConsumerGroup {
	return &flov1.ConsumerGroup{
		Namespace: g.Namespace, Stream: g.Stream, Name: g.Group.Name, MaxDeliveries: g.Group.MaxDeliveries, Mode: g.Group.Mode,
		Lag: g.Lag, Pending: g.Pending, CreatedAt: timestamppb.New(g.Group.CreatedAt),
	}
}

// recordProto encodes a record; withValue adds the payload as a JSON value
// when it is JSON, for REST readers.
func recordProto(r record.Record, withValue bool) *flov1.StreamRecord {
	out := &flov1.StreamRecord{
		Id: r.ID.String(), Payload: r.Payload, Headers: r.Headers, Key: r.Key, Partition: r.Partition,
		AppendedAt: timestamppb.New(r.AppendedAt), DeliveryCount: int32(r.DeliveryCount), TraceContext: r.Trace,
	}
	if withValue {
		var v any
		if err := json.Unmarshal(r.Payload, &v); err == nil {
			if pv, err := structpb.NewValue(v); err == nil {
				out.Value = pv
			}
		}
	}
	return out
}

// encodeJSON renders a JSON value the way a JSON client wrote it, without
// protojson's deliberately unstable spacing or HTML escaping.
func encodeJSON(v *structpb.Value) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v.AsInterface()); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
