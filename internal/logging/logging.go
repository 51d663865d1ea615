// Package logging owns restow's logger: zap behind go-logr/zapr, configured by
// --log-level and --log-encoding, ISO8601 timestamps, and klog (client-go's
// logger) routed into the same sink so every line has one format.
package logging

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
)

// Options are the logging flags.
type Options struct {
	// Level is "debug", "info", "error", or a number n for logr's V(n).
	Level string
	// Encoding is "json" or "console".
	Encoding string
}

// BindFlags registers --log-level and --log-encoding on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Level, "log-level", "info", `Log verbosity: "debug", "info", "error", or a number n to include logr V(n) lines (debug is V(1); per-object detail is V(4)).`)
	fs.StringVar(&o.Encoding, "log-encoding", "json", `Log encoding: "json" or "console".`)
}

// New builds a logger that writes to stderr.
func New(o Options) (logr.Logger, error) {
	return NewWithSink(o, zapcore.Lock(os.Stderr))
}

// NewWithSink builds a logger that writes to sink. Tests use it to capture lines.
func NewWithSink(o Options, sink zapcore.WriteSyncer) (logr.Logger, error) {
	level, err := parseLevel(o.Level)
	if err != nil {
		return logr.Discard(), err
	}
	encoderConfig := zap.NewProductionEncoderConfig()
	encoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	var encoder zapcore.Encoder
	switch o.Encoding {
	case "json", "":
		encoder = zapcore.NewJSONEncoder(encoderConfig)
	case "console":
		encoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
		encoder = zapcore.NewConsoleEncoder(encoderConfig)
	default:
		return logr.Discard(), fmt.Errorf("invalid --log-encoding %q: want json or console", o.Encoding)
	}
	core := zapcore.NewCore(encoder, sink, level)
	// zapr's sink skips logr's frame already (zapr.NewLogger initialised
	// it); logr.New initialises it again through quietCancel, which skips
	// one frame more: quietCancel's own.
	zapSink := zapr.NewLogger(zap.New(core, zap.AddCaller(), zap.ErrorOutput(sink))).GetSink()
	return logr.New(quietCancel{zapSink}), nil
}

// quietCancel logs an error that a cancelled context caused as a debug
// line (V(1)) rather than an error: the manager cancels its own requests
// when it stops (a rollout, a lost leader) and when it restarts a pass,
// and client-go logs each one cut short while reading its response as an
// error, which would fire a user's alert on error logs at every rollout.
type quietCancel struct{ logr.LogSink }

// Info is the sink's, in a frame of its own as Error's, so that both skip
// alike to the caller.
func (s quietCancel) Info(level int, msg string, keysAndValues ...any) {
	s.LogSink.Info(level, msg, keysAndValues...)
}

func (s quietCancel) Error(err error, msg string, keysAndValues ...any) {
	if !cancelled(err) {
		s.LogSink.Error(err, msg, keysAndValues...)
		return
	}
	if s.Enabled(1) {
		s.LogSink.Info(1, msg, append(keysAndValues, "error", err.Error())...)
	}
}

func (s quietCancel) WithValues(keysAndValues ...any) logr.LogSink {
	return quietCancel{s.LogSink.WithValues(keysAndValues...)}
}

func (s quietCancel) WithName(name string) logr.LogSink {
	return quietCancel{s.LogSink.WithName(name)}
}

func (s quietCancel) WithCallDepth(depth int) logr.LogSink {
	if withDepth, ok := s.LogSink.(logr.CallDepthLogSink); ok {
		return quietCancel{withDepth.WithCallDepth(depth)}
	}
	return s
}

// cancelled says whether err is a context's cancellation, as such or as
// the text a transport left of it. A deadline is not: that is a timeout,
// and an error; nor is an answer of the API server whose message happens
// to end so: only this process's own cancellation is quiet.
func cancelled(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.Canceled):
		return true
	}
	var status apierrors.APIStatus
	return !errors.As(err, &status) && strings.HasSuffix(err.Error(), context.Canceled.Error())
}

// Setup builds the logger, makes it klog's and returns it; the caller hands it
// to controller-runtime with ctrl.SetLogger.
func Setup(o Options) (logr.Logger, error) {
	return setup(o, zapcore.Lock(os.Stderr))
}

func setup(o Options, sink zapcore.WriteSyncer) (logr.Logger, error) {
	log, err := NewWithSink(o, sink)
	if err != nil {
		return log, err
	}
	klog.SetLogger(log)
	return log, nil
}

// parseLevel maps the flag to a zap level. logr's V(n) is zap level -n, so a
// numeric level n enables V(0) through V(n).
func parseLevel(s string) (zapcore.Level, error) {
	switch strings.ToLower(s) {
	case "", "info":
		return zapcore.InfoLevel, nil
	case "debug":
		return zapcore.DebugLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 127 {
		return 0, errors.New(`invalid --log-level ` + strconv.Quote(s) + `: want "debug", "info", "error" or a verbosity 0-127`)
	}
	return zapcore.Level(-n), nil
}
