package main

import (
	"errors"
	"fmt"
	"sort"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// checkCannedComplete makes sure every canned message sets every field that
// upstream's message defines (repeated fields with at least two entries), so
// that an upstream field missing from our protos cannot go unnoticed: the
// Rust test sees it as bytes its decoder dropped. A field counts as set when
// it is non-zero in at least one instance (so a bool may be false in one
// element of a list and true in another). A response's own `messages` list
// may hold one message. Metadata is the exception: its error and status are
// set only on the stand-in for a failed node, and at least one such stand-in
// must exist.
func checkCannedComplete() error {
	canned := cannedByName()

	names := make([]string, 0, len(canned))
	for name := range canned {
		names = append(names, name)
	}

	sort.Strings(names)

	var errs []error

	sawError := false

	for _, name := range names {
		w := walker{sawError: &sawError, set: map[string]bool{}}
		w.message(name, canned[name].ProtoReflect())
		errs = append(errs, w.errs...)

		paths := make([]string, 0, len(w.set))
		for path := range w.set {
			paths = append(paths, path)
		}

		sort.Strings(paths)

		for _, path := range paths {
			if !w.set[path] {
				errs = append(errs, fmt.Errorf("%s: unset (or zero) in every instance", path))
			}
		}
	}

	if !sawError {
		errs = append(errs, errors.New("no canned message carries metadata.error and metadata.status"))
	}

	return errors.Join(errs...)
}

type walker struct {
	errs     []error
	sawError *bool
	// set records, per field path without list indices, whether any
	// instance had the field set.
	set map[string]bool
	// depth is 1 while walking the top-level message's own fields.
	depth int
}

func (w *walker) fail(path, what string) {
	w.errs = append(w.errs, fmt.Errorf("%s: %s", path, what))
}

func (w *walker) message(path string, m protoreflect.Message) {
	w.depth++
	defer func() { w.depth-- }()

	fields := m.Descriptor().Fields()

	if m.Descriptor().FullName() == "common.Metadata" {
		w.metadata(path, m)

		return
	}

	// A failed node's stand-in carries metadata only.
	if mdField := fields.ByName("metadata"); mdField != nil && m.Has(mdField) {
		md := m.Get(mdField).Message()
		if errField := md.Descriptor().Fields().ByName("error"); md.Has(errField) {
			w.metadata(path+".metadata", md)

			return
		}
	}

	for i := range fields.Len() {
		w.field(path, m, fields.Get(i))
	}
}

func (w *walker) metadata(path string, md protoreflect.Message) {
	fields := md.Descriptor().Fields()
	hostname, errField, status := fields.ByName("hostname"), fields.ByName("error"), fields.ByName("status")

	if !md.Has(hostname) {
		w.fail(path+".hostname", "unset")
	}

	switch {
	case md.Has(errField) && md.Has(status):
		*w.sawError = true

		w.message(path+".status", md.Get(status).Message())
	case md.Has(errField) || md.Has(status):
		w.fail(path, "error and status must be set together")
	}
}

func (w *walker) field(path string, m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	path = path + "." + string(fd.Name())

	switch {
	case fd.IsMap():
		w.fail(path, "maps are not expected in this API subset")
	case fd.IsList():
		list := m.Get(fd).List()
		if list.Len() < 2 && !(w.depth == 1 && fd.Name() == "messages") {
			w.fail(path, fmt.Sprintf("repeated field has %d entries, want at least 2", list.Len()))
		}

		if fd.Kind() == protoreflect.MessageKind {
			for i := range list.Len() {
				w.message(path+"[]", list.Get(i).Message())
			}
		}
	default:
		w.set[path] = w.set[path] || m.Has(fd)

		if fd.Kind() == protoreflect.MessageKind && m.Has(fd) {
			w.message(path, m.Get(fd).Message())
		}
	}
}
