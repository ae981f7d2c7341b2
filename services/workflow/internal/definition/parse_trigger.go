package definition

import (
	"github.com/razorbill/flo/libs/text"
)

var triggerFields = []string{"stream", "namespace", "consumer_group", "mode", "batch_size"}

var triggerModes = []string{string(TriggerShared), string(TriggerExclusive), string(TriggerKeyShared)}

// trigger reads the trigger section into def.Trigger; nil when it has
// errors. It runs after the name is read, for the default consumer group.
func (p *parser) trigger(f field, def *Definition) {
	fields := p.object(f.value, f.path, "the trigger", triggerFields)
	if fields == nil {
		return
	}
	before := len(p.diags)
	t := &Trigger{Mode: TriggerShared, BatchSize: 1, ConsumerGroup: "wf-" + def.Name, Pos: pos(f.key)}
	if sf, ok := fields["stream"]; !ok {
		p.errorf(CodeTriggerStream, f.key, f.path, "a trigger needs a stream: the name of the stream whose records start runs")
	} else if v, ok := p.str(sf, false); ok {
		if err := text.StreamName("stream", v); err != nil {
			p.errorf(CodeTriggerStream, sf.value, sf.path, "stream %q is invalid: use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'", clip(v))
		}
		t.Stream = v
	}
	if nf, ok := fields["namespace"]; ok {
		if v, ok := p.str(nf, false); ok {
			if err := text.Name("namespace", v); err != nil {
				p.errorf(CodeTriggerNamespace, nf.value, nf.path, "namespace %q is invalid: use 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit", clip(v))
			}
			t.Namespace = v
		}
	}
	if gf, ok := fields["consumer_group"]; ok {
		if v, ok := p.str(gf, false); ok {
			if err := text.StreamName("consumer_group", v); err != nil {
				p.errorf(CodeTriggerGroup, gf.value, gf.path, "consumer_group %q is invalid: use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'", clip(v))
			}
			t.ConsumerGroup = v
		}
	} else if len(t.ConsumerGroup) > nameMaxLen {
		p.errorf(CodeTriggerGroup, f.key, f.path, "the default consumer group wf-%s is longer than %d bytes: name one with consumer_group", clip(def.Name), nameMaxLen)
	}
	if mf, ok := fields["mode"]; ok {
		if v, ok := p.str(mf, false); ok {
			switch TriggerMode(v) {
			case TriggerShared, TriggerExclusive, TriggerKeyShared:
				t.Mode = TriggerMode(v)
			default:
				p.errorf(CodeTriggerMode, mf.value, mf.path, "mode must be shared, exclusive or key_shared, not %q%s", clip(v), suggest(v, triggerModes))
			}
		}
	}
	if bf, ok := fields["batch_size"]; ok {
		t.BatchSize = p.count(bf, CodeTriggerBatch, MaxTriggerBatch, 1)
	}
	if len(p.diags) == before {
		def.Trigger = t
	}
}
