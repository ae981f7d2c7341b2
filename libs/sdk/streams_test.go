package flo_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// streamsPeer plays the gateway's StreamService: it keeps the groups created, answers the
// other calls with fixed data, and keeps every request so a test can check what the client
// sent.
type streamsPeer struct {
	flov1.UnimplementedStreamServiceServer
	record func(string)

	mu             sync.Mutex
	groups         map[string]bool
	createGroupErr error
	requests       []proto.Message
}

func newStreamsPeer(record func(string)) *streamsPeer {
	return &streamsPeer{record: record, groups: map[string]bool{}}
}

func (s *streamsPeer) keep(req proto.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, req)
}

// last returns the last request kept.
func (s *streamsPeer) last() proto.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[len(s.requests)-1]
}

func (s *streamsPeer) setCreateGroupErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.createGroupErr = err
}

func (s *streamsPeer) addGroup(stream, group string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[stream+"/"+group] = true
}

var created = timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))

func (s *streamsPeer) CreateGroup(_ context.Context, req *flov1.CreateGroupRequest) (*flov1.ConsumerGroup, error) {
	s.keep(req)
	call := fmt.Sprintf("create-group %s/%s/%s from %s", req.GetNamespace(), req.GetStream(), req.GetName(), req.GetStart())
	if req.GetMode() != "" {
		call += " mode " + req.GetMode()
	}
	s.record(call)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.createGroupErr != nil {
		return nil, s.createGroupErr
	}
	key := req.GetStream() + "/" + req.GetName()
	if s.groups[key] {
		return nil, status.Errorf(codes.AlreadyExists, "group %s of stream %s exists", req.GetName(), req.GetStream())
	}
	s.groups[key] = true
	return &flov1.ConsumerGroup{
		Namespace: req.GetNamespace(), Stream: req.GetStream(), Name: req.GetName(),
		MaxDeliveries: max(req.GetMaxDeliveries(), 5), Mode: cmp.Or(req.GetMode(), flo.GroupShared), CreatedAt: created,
	}, nil
}

func (s *streamsPeer) CreateStream(_ context.Context, req *flov1.CreateStreamRequest) (*flov1.Stream, error) {
	s.keep(req)
	return &flov1.Stream{
		Namespace: req.GetNamespace(), Name: req.GetName(), Partitions: max(req.GetPartitions(), 1),
		RetentionMs: req.GetRetentionMs(), RetentionBytes: req.GetRetentionBytes(), CreatedAt: created,
	}, nil
}

func (s *streamsPeer) GetStream(_ context.Context, req *flov1.GetStreamRequest) (*flov1.StreamInfo, error) {
	s.keep(req)
	if req.GetStream() != "events" {
		return nil, status.Errorf(codes.NotFound, "stream %q not found", req.GetStream())
	}
	return &flov1.StreamInfo{
		Stream:  &flov1.Stream{Namespace: req.GetNamespace(), Name: "events", Partitions: 4, RetentionMs: 86_400_000, CreatedAt: created},
		Length:  42,
		FirstId: "1767323045000-0",
		LastId:  "1767323099000-41003",
		Groups: []*flov1.ConsumerGroup{{
			Namespace: req.GetNamespace(), Stream: "events", Name: "processors", MaxDeliveries: 5, Mode: flo.GroupShared, Lag: 7, Pending: 2, CreatedAt: created,
		}},
	}, nil
}

func (s *streamsPeer) ListStreams(_ context.Context, req *flov1.ListStreamsRequest) (*flov1.ListStreamsResponse, error) {
	s.keep(req)
	return &flov1.ListStreamsResponse{Streams: []*flov1.Stream{
		{Namespace: req.GetNamespace(), Name: "events", Partitions: 4},
		{Namespace: req.GetNamespace(), Name: "events.dlq", Partitions: 1},
	}}, nil
}

func (s *streamsPeer) DeleteStream(_ context.Context, req *flov1.GetStreamRequest) (*flov1.DeleteStreamResponse, error) {
	s.keep(req)
	return &flov1.DeleteStreamResponse{}, nil
}

func (s *streamsPeer) Append(_ context.Context, req *flov1.AppendRequest) (*flov1.AppendResponse, error) {
	s.keep(req)
	ids := make([]string, len(req.GetRecords()))
	for i := range ids {
		ids[i] = fmt.Sprintf("1767323045000-%d", i*1000)
	}
	return &flov1.AppendResponse{Ids: ids}, nil
}

func (s *streamsPeer) Read(_ context.Context, req *flov1.ReadRequest) (*flov1.ReadResponse, error) {
	s.keep(req)
	value, _ := structpb.NewValue(map[string]any{"type": "login"})
	return &flov1.ReadResponse{
		Records: []*flov1.StreamRecord{
			{
				Id: "1767323045000-0", Payload: []byte(`{"type":"signup"}`), Headers: map[string]string{"source": "web"},
				Key: "user-1", Partition: 0, AppendedAt: created,
			},
			// Only the JSON value, as a REST append might leave it.
			{Id: "1767323045001-1001", Value: value, Partition: 1, AppendedAt: created},
		},
		Next: "@9.1.1",
	}, nil
}

func (s *streamsPeer) ListGroups(_ context.Context, req *flov1.ListGroupsRequest) (*flov1.ListGroupsResponse, error) {
	s.keep(req)
	return &flov1.ListGroupsResponse{Groups: []*flov1.ConsumerGroup{{
		Namespace: req.GetNamespace(), Stream: req.GetStream(), Name: "processors", MaxDeliveries: 5, Mode: flo.GroupShared, Lag: 7, Pending: 2,
	}}}, nil
}

func (s *streamsPeer) DeleteGroup(_ context.Context, req *flov1.GetGroupRequest) (*flov1.DeleteGroupResponse, error) {
	s.keep(req)
	return &flov1.DeleteGroupResponse{}, nil
}

func (s *streamsPeer) ListPending(_ context.Context, req *flov1.ListPendingRequest) (*flov1.ListPendingResponse, error) {
	s.keep(req)
	return &flov1.ListPendingResponse{
		Entries: []*flov1.PendingEntry{{
			Id: "1767323045000-0", Consumer: "w-1", DeliveryCount: 2, DeliveredAt: created,
			RedeliverAt: timestamppb.New(created.AsTime().Add(5 * time.Minute)),
		}},
		Total: 9,
	}, nil
}

func requireSent(t *testing.T, want, got proto.Message) {
	t.Helper()
	require.True(t, proto.Equal(want, got), "want %v\ngot  %v", want, got)
}

func TestClientManagesStreams(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	s := p.streamSvc
	ctx := context.Background()

	stream, err := client.CreateStream(ctx, "events", flo.StreamOptions{Partitions: 4, Retention: 24 * time.Hour, RetentionBytes: 1 << 30})
	require.NoError(t, err)
	requireSent(t, &flov1.CreateStreamRequest{Namespace: "myapp", Name: "events", Partitions: 4, RetentionMs: 86_400_000, RetentionBytes: 1 << 30}, s.last())
	require.Equal(t, &flo.Stream{
		Namespace: "myapp", Name: "events", Partitions: 4, Retention: 24 * time.Hour, RetentionBytes: 1 << 30,
		CreatedAt: created.AsTime(),
	}, stream)
	b, err := json.Marshal(stream)
	require.NoError(t, err)
	require.JSONEq(t, `{"namespace":"myapp","name":"events","partitions":4,"retention":"24h0m0s",
		"retention_bytes":1073741824,"created_at":"2026-01-02T03:04:05Z"}`, string(b))

	info, err := client.GetStream(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, int64(42), info.Length)
	require.Equal(t, "1767323045000-0", info.FirstID)
	require.Equal(t, "1767323099000-41003", info.LastID)
	require.Equal(t, 4, info.Stream.Partitions)
	require.Equal(t, []*flo.ConsumerGroup{{
		Namespace: "myapp", Stream: "events", Name: "processors", MaxDeliveries: 5, Mode: flo.GroupShared, Lag: 7, Pending: 2, CreatedAt: created.AsTime(),
	}}, info.Groups)
	b, err = json.Marshal(info)
	require.NoError(t, err)
	require.JSONEq(t, `{
		"stream": {"namespace":"myapp","name":"events","partitions":4,"retention":"24h0m0s","retention_bytes":0,
			"created_at":"2026-01-02T03:04:05Z"},
		"length": 42, "first_id": "1767323045000-0", "last_id": "1767323099000-41003",
		"groups": [{"namespace":"myapp","stream":"events","name":"processors","max_deliveries":5,"mode":"shared","lag":7,"pending":2,
			"created_at":"2026-01-02T03:04:05Z"}]
	}`, string(b))

	_, err = client.GetStream(ctx, "ghost")
	require.Equal(t, codes.NotFound, status.Code(err))
	require.True(t, strings.HasPrefix(err.Error(), "get stream ghost:"), err.Error())

	list, err := client.ListStreams(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "events.dlq", list[1].Name)
	requireSent(t, &flov1.ListStreamsRequest{Namespace: "myapp", Limit: 1000}, s.last())

	require.NoError(t, client.DeleteStream(ctx, "events"))
	requireSent(t, &flov1.GetStreamRequest{Namespace: "myapp", Stream: "events"}, s.last())
}

func TestClientAppendsRecords(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	s := p.streamSvc
	ctx := context.Background()

	id, err := client.Append(ctx, "events", map[string]string{"type": "signup"},
		flo.WithKey("user-1"), flo.WithHeaders(map[string]string{"source": "web"}), flo.WithHeaders(map[string]string{"v": "2"}))
	require.NoError(t, err)
	require.Equal(t, "1767323045000-0", id)
	requireSent(t, &flov1.AppendRequest{Namespace: "myapp", Stream: "events", Records: []*flov1.AppendRecord{{
		Payload: []byte(`{"type":"signup"}`), Key: "user-1", Headers: map[string]string{"source": "web", "v": "2"},
	}}}, s.last())

	ids, err := client.AppendMany(ctx, "events", []any{json.RawMessage(`{"n":1}`), []byte("raw"), nil}, flo.WithKey("k"))
	require.NoError(t, err)
	require.Equal(t, []string{"1767323045000-0", "1767323045000-1000", "1767323045000-2000"}, ids)
	requireSent(t, &flov1.AppendRequest{Namespace: "myapp", Stream: "events", Records: []*flov1.AppendRecord{
		{Payload: []byte(`{"n":1}`), Key: "k"}, {Payload: []byte("raw"), Key: "k"}, {Key: "k"},
	}}, s.last())

	ids, err = client.AppendRecords(ctx, "events", []flo.AppendRecord{
		{Payload: map[string]int{"n": 1}, Key: "a"},
		{Payload: "two", Headers: map[string]string{"h": "v"}},
	})
	require.NoError(t, err)
	require.Len(t, ids, 2)
	requireSent(t, &flov1.AppendRequest{Namespace: "myapp", Stream: "events", Records: []*flov1.AppendRecord{
		{Payload: []byte(`{"n":1}`), Key: "a"}, {Payload: []byte(`"two"`), Headers: map[string]string{"h": "v"}},
	}}, s.last())

	ids, err = client.AppendRecords(ctx, "events", nil)
	require.NoError(t, err, "no records is no call")
	require.Empty(t, ids)
	_, err = client.AppendMany(ctx, "events", []any{1, func() {}})
	require.ErrorContains(t, err, "record 1")
}

func TestClientReadsRecords(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	ctx := context.Background()

	records, next, err := client.Read(ctx, "events", flo.ReadOptions{Start: "$", End: "+", Count: 50, Tail: 3, Block: 2 * time.Second})
	require.NoError(t, err)
	requireSent(t, &flov1.ReadRequest{Namespace: "myapp", Stream: "events", Start: "$", End: "+", Count: 50, Tail: 3, BlockMs: 2000}, p.streamSvc.last())
	require.Equal(t, "@9.1.1", next)
	require.Len(t, records, 2)
	require.Equal(t, &flo.Record{
		ID: "1767323045000-0", Payload: []byte(`{"type":"signup"}`), Headers: map[string]string{"source": "web"},
		Key: "user-1", AppendedAt: created.AsTime(),
	}, records[0])
	var event map[string]string
	require.NoError(t, records[0].Into(&event))
	require.Equal(t, "signup", event["type"])
	require.JSONEq(t, `{"type":"login"}`, string(records[1].Payload), "a record with only its JSON value")
	require.Equal(t, 1, records[1].Partition)

	b, err := json.Marshal(records)
	require.NoError(t, err)
	require.JSONEq(t, `[
		{"id":"1767323045000-0","payload":{"type":"signup"},"headers":{"source":"web"},"key":"user-1","partition":0,
			"appended_at":"2026-01-02T03:04:05Z"},
		{"id":"1767323045001-1001","payload":{"type":"login"},"partition":1,"appended_at":"2026-01-02T03:04:05Z"}
	]`, string(b))
	b, err = json.Marshal(flo.Record{ID: "1-0", Payload: []byte{0xff, 0x00}, DeliveryCount: 2})
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"1-0","payload":"/wA=","partition":0,"delivery_count":2}`, string(b), "binary payloads as base64")
}

func TestClientManagesGroups(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	s := p.streamSvc
	ctx := context.Background()

	g, err := client.CreateGroup(ctx, "events", "audit", flo.GroupOptions{Start: "$", MaxDeliveries: 8, Mode: flo.GroupExclusive})
	require.NoError(t, err)
	requireSent(t, &flov1.CreateGroupRequest{Namespace: "myapp", Stream: "events", Name: "audit", Start: "$", MaxDeliveries: 8, Mode: "exclusive"}, s.last())
	require.Equal(t, &flo.ConsumerGroup{Namespace: "myapp", Stream: "events", Name: "audit", MaxDeliveries: 8, Mode: "exclusive", CreatedAt: created.AsTime()}, g)
	_, err = client.CreateGroup(ctx, "events", "audit", flo.GroupOptions{})
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	require.True(t, strings.HasPrefix(err.Error(), "create group audit of stream events:"), err.Error())

	groups, err := client.ListGroups(ctx, "events")
	require.NoError(t, err)
	require.Len(t, groups, 1)
	require.Equal(t, int64(7), groups[0].Lag)
	require.Equal(t, int64(2), groups[0].Pending)

	entries, total, err := client.ListPending(ctx, "events", "processors", flo.PendingOptions{Consumer: "w-1", Limit: 20})
	require.NoError(t, err)
	requireSent(t, &flov1.ListPendingRequest{Namespace: "myapp", Stream: "events", Group: "processors", Consumer: "w-1", Limit: 20}, s.last())
	require.Equal(t, int64(9), total)
	require.Equal(t, []*flo.PendingEntry{{
		ID: "1767323045000-0", Consumer: "w-1", DeliveryCount: 2,
		DeliveredAt: created.AsTime(), RedeliverAt: created.AsTime().Add(5 * time.Minute),
	}}, entries)
	b, err := json.Marshal(entries[0])
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"1767323045000-0","consumer":"w-1","delivery_count":2,
		"delivered_at":"2026-01-02T03:04:05Z","redeliver_at":"2026-01-02T03:09:05Z"}`, string(b))

	require.NoError(t, client.DeleteGroup(ctx, "events", "audit"))
	requireSent(t, &flov1.GetGroupRequest{Namespace: "myapp", Stream: "events", Group: "audit"}, s.last())
}

func TestStreamCallsNeedAConnection(t *testing.T) {
	t.Parallel()
	client := flo.NewClient("127.0.0.1:1")
	ctx := context.Background()
	_, err := client.Append(ctx, "events", 1)
	require.ErrorIs(t, err, flo.ErrNotConnected)
	_, _, err = client.Read(ctx, "events", flo.ReadOptions{})
	require.ErrorIs(t, err, flo.ErrNotConnected)
	_, err = client.CreateStream(ctx, "events", flo.StreamOptions{})
	require.ErrorIs(t, err, flo.ErrNotConnected)
}
