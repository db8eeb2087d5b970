"""The report: papermill runs each notebook with params.yaml (kvlab.report.params), nbconvert renders HTML and
WeasyPrint the PDF (kvlab.report.build). `kvlab report` is the command."""
