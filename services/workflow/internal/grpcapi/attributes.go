package grpcapi

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// attributesProto renders a run's search attributes, each value in the
// field of its type.
func attributesProto(attrs []definition.AttributeValue) []*flov1.SearchAttribute {
	if len(attrs) == 0 {
		return nil
	}
	out := make([]*flov1.SearchAttribute, len(attrs))
	for i, a := range attrs {
		sa := &flov1.SearchAttribute{Name: a.Name}
		switch a.Type {
		case definition.AttributeString:
			sa.Value = &flov1.SearchAttribute_StringValue{StringValue: a.Str}
		case definition.AttributeNumber:
			sa.Value = &flov1.SearchAttribute_NumberValue{NumberValue: a.Num}
		case definition.AttributeTimestamp:
			sa.Value = &flov1.SearchAttribute_TimestampValue{TimestampValue: timestamppb.New(a.Time)}
		}
		out[i] = sa
	}
	return out
}
