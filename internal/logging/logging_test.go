package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
)

func TestLevels(t *testing.T) {
	tests := []struct {
		level     string
		wantV     []int // verbosities that must be written
		wantNotV  []int // verbosities that must be dropped
		wantError bool
	}{
		{level: "info", wantV: []int{0}, wantNotV: []int{1, 4}},
		{level: "", wantV: []int{0}, wantNotV: []int{1}},
		{level: "debug", wantV: []int{0, 1}, wantNotV: []int{2}},
		{level: "4", wantV: []int{0, 1, 4}, wantNotV: []int{5}},
		{level: "error", wantNotV: []int{0}},
		{level: "loud", wantError: true},
		{level: "-1", wantError: true},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := NewWithSink(Options{Level: tt.level, Encoding: "json"}, zapcore.AddSync(&buf))
			if tt.wantError {
				if err == nil {
					t.Fatalf("level %q: want error, got none", tt.level)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range tt.wantV {
				buf.Reset()
				log.V(v).Info("Hello")
				if buf.Len() == 0 {
					t.Errorf("level %q: V(%d) was dropped", tt.level, v)
				}
			}
			for _, v := range tt.wantNotV {
				buf.Reset()
				log.V(v).Info("Hello")
				if buf.Len() != 0 {
					t.Errorf("level %q: V(%d) was written: %s", tt.level, v, buf.String())
				}
			}
		})
	}
}

func TestJSONLineHasISO8601TimeAndKeys(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewWithSink(Options{Level: "info", Encoding: "json"}, zapcore.AddSync(&buf))
	if err != nil {
		t.Fatal(err)
	}
	log.Info("Pass finished", "migrated", 3)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %q: %v", buf.String(), err)
	}
	if line["msg"] != "Pass finished" || line["migrated"] != float64(3) {
		t.Errorf("unexpected line: %v", line)
	}
	ts, _ := line["ts"].(string)
	if len(ts) < len("2006-01-02T15:04:05") || ts[4] != '-' || ts[10] != 'T' {
		t.Errorf("ts %q is not ISO8601", ts)
	}
}

func TestConsoleEncodingAndInvalidEncoding(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewWithSink(Options{Level: "info", Encoding: "console"}, zapcore.AddSync(&buf))
	if err != nil {
		t.Fatal(err)
	}
	log.Info("Started")
	if !strings.Contains(buf.String(), "INFO\t") || strings.HasPrefix(buf.String(), "{") {
		t.Errorf("not a console line: %q", buf.String())
	}
	if _, err := NewWithSink(Options{Encoding: "xml"}, zapcore.AddSync(&buf)); err == nil {
		t.Error("encoding xml: want error")
	}
}

func TestKlogIsRoutedIntoTheSameSink(t *testing.T) {
	var buf bytes.Buffer
	if _, err := setup(Options{Level: "info", Encoding: "json"}, zapcore.AddSync(&buf)); err != nil {
		t.Fatal(err)
	}
	defer klog.ClearLogger()
	klog.InfoS("From client-go", "key", "value")
	klog.Flush()
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("klog line is not JSON from our sink: %q: %v", buf.String(), err)
	}
	if line["msg"] != "From client-go" || line["key"] != "value" {
		t.Errorf("unexpected line: %v", line)
	}
}

// TestCancelledIsNoError: an error a cancelled context caused (the
// manager's own requests, cut short as it stops) is a debug line, not an
// error; any other error, a deadline included, stays an error; and the
// caller is still the line that logged.
func TestCancelledIsNoError(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewWithSink(Options{Level: "debug", Encoding: "json"}, zapcore.AddSync(&buf))
	if err != nil {
		t.Fatal(err)
	}
	line := func() map[string]any {
		t.Helper()
		var entry map[string]any
		if err := json.Unmarshal(buf.Bytes(), &entry); err != nil {
			t.Fatalf("%v: %s", err, buf.String())
		}
		buf.Reset()
		return entry
	}
	log.WithValues("controller", "storagemigration").Error(fmt.Errorf("reading: %w", context.Canceled), "Unexpected error when reading response body")
	if got := line(); got["level"] != "debug" || got["error"] != "reading: context canceled" || got["controller"] != "storagemigration" {
		t.Errorf("a cancelled request logged %v, want a debug line with the error and the logger's values", got)
	}
	log.Error(errors.New("read tcp 127.0.0.1:1234: context canceled"), "Unexpected error when reading response body")
	if got := line(); got["level"] != "debug" {
		t.Errorf("a cancellation as a transport's text logged %v, want a debug line", got)
	}
	log.Error(apierrors.NewInternalError(errors.New("admission webhook: context canceled")), "Refused")
	if got := line(); got["level"] != "error" {
		t.Errorf("an API server's answer that ends in %q logged %v, want an error line", context.Canceled, got)
	}
	log.Error(context.DeadlineExceeded, "Timed out")
	if got := line(); got["level"] != "error" || !strings.HasPrefix(got["caller"].(string), "logging/logging_test.go:") {
		t.Errorf("a deadline logged %v, want an error line whose caller is this test", got)
	}
	log.Info("Hello")
	if got := line(); !strings.HasPrefix(got["caller"].(string), "logging/logging_test.go:") {
		t.Errorf("caller %v, want this test", got["caller"])
	}
	quiet, err := NewWithSink(Options{Level: "info", Encoding: "json"}, zapcore.AddSync(&buf))
	if err != nil {
		t.Fatal(err)
	}
	quiet.Error(context.Canceled, "Cancelled")
	if buf.Len() != 0 {
		t.Errorf("at info level a cancelled request logged %s, want nothing", buf.String())
	}
}
