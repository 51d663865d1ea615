// Package logging owns restow's logger: zap behind go-logr/zapr, configured by
// --log-level and --log-encoding, ISO8601 timestamps, and klog (client-go's
// logger) routed into the same sink so every line has one format.
package logging

import (
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
	return zapr.NewLogger(zap.New(core, zap.AddCaller(), zap.ErrorOutput(sink))), nil
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
